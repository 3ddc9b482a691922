import pytest

from forge.errors import ValidationError
from forge.model import (
    MAX_CONTENT_CHARS,
    Context,
    Episode,
    Kind,
    Relation,
    Scope,
    Status,
    Step,
    Unit,
    Viewer,
)


def test_unit_defaults_and_round_trip():
    u = Unit("When the door is locked, then look for a key.", kind="rule",
             context=Context(domain="house", tags=("door", "door", " key ")), owner="a", scope="private")
    assert u.kind is Kind.RULE and u.status is Status.ACTIVE
    assert u.context.tags == ("door", "key")
    assert u.updated_at == u.created_at
    assert Unit.from_dict(u.to_dict()) == u


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"content": ""}, "empty"),
        ({"content": "   "}, "empty"),
        ({"content": "x" * (MAX_CONTENT_CHARS + 1)}, "limit"),
        ({"content": "x", "kind": "dream"}, "unknown kind"),
        ({"content": "x", "confidence": 1.5}, "between 0 and 1"),
        ({"content": "x", "importance": float("nan")}, "finite"),
        ({"content": "x", "scope": "private"}, "owner"),
        ({"content": "x", "scope": "group:"}, "name"),
        ({"content": "x", "scope": "galaxy"}, "unknown scope"),
        ({"content": "x", "status": "sleeping"}, "unknown status"),
    ],
)
def test_unit_validation(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        Unit(**kwargs)


def test_from_dict_rejects_unknown_fields_and_bad_types():
    with pytest.raises(ValidationError, match="unknown unit field"):
        Unit.from_dict({"content": "x", "colour": "red"})
    with pytest.raises(ValidationError, match="tags"):
        Unit.from_dict({"content": "x", "context": {"tags": "not-a-list"}})
    with pytest.raises(ValidationError, match="no content"):
        Unit.from_dict({"kind": "fact"})


def test_relation_validation():
    with pytest.raises(ValidationError, match="unknown relation"):
        Relation("a", "b", "likes")
    with pytest.raises(ValidationError, match="itself"):
        Relation("a", "a", "supports")
    r = Relation("a", "b", "contradicts", weight=0.5)
    assert Relation.from_dict(r.to_dict()) == r


def test_scope_and_viewer_visibility():
    pub = Unit("g", scope="global")
    mine = Unit("p", scope="private", owner="alice")
    team = Unit("t", scope=Scope.parse("group:red"))
    alice = Viewer.of("alice", ["red"])
    bob = Viewer.of("bob")
    assert all(alice.can_see(u) for u in (pub, mine, team))
    assert bob.can_see(pub) and not bob.can_see(mine) and not bob.can_see(team)
    assert Viewer.admin().can_see(mine)
    assert str(Scope.parse("group:red")) == "group:red"


def test_episode_round_trip():
    ep = Episode(agent="a", task="t", env="frozenlake", steps=[Step("obs", "think", "left", -1.0, role="planner")],
                 outcome={"success": False})
    assert ep.total_reward == -1.0
    assert Episode.from_dict(ep.to_dict()) == ep


# -- types and sizes at the model edge (issue 9) ---------------------------------------------


from forge.model import MAX_FIELD_CHARS, MAX_META_BYTES, MAX_TAGS  # noqa: E402


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"content": "x", "owner": 7}, "owner must be a string"),
        ({"content": "x", "owner": ["a"]}, "owner must be a string"),
        ({"content": "x", "created_at": "yesterday"}, "created_at must be a finite number"),
        ({"content": "x", "updated_at": "now"}, "updated_at"),
        ({"content": "x", "last_access": float("inf")}, "last_access"),
        ({"content": "x", "confidence": "high"}, "confidence"),
        ({"content": "x", "access_count": True}, "access_count"),
        ({"content": 5}, "content must be a string"),
        ({"content": "bad \ud800 text"}, "surrogate"),
        ({"content": "x", "id": 5}, "unit id"),
        ({"content": "x", "meta": {"blob": "y" * (MAX_META_BYTES + 1)}}, "limit"),
        ({"content": "x", "meta": {"f": object()}}, "not JSON"),
        ({"content": "x", "meta": [1]}, "JSON object"),
        ({"content": "x", "context": {"domain": "d"}}, "must be a Context"),
        ({"content": "x", "scope": 5}, "scope must be a string"),
        ({"content": "x", "scope": "group:" + "g" * 300}, "limit"),
    ],
)
def test_unit_types_and_sizes(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        Unit(**kwargs)


def test_context_and_provenance_limits():
    with pytest.raises(ValidationError, match="tags"):
        Context(tags=tuple(f"t{i}" for i in range(MAX_TAGS + 1)))
    with pytest.raises(ValidationError, match="context.domain"):
        Context(domain="d" * (MAX_FIELD_CHARS + 1))
    with pytest.raises(ValidationError, match="context.task"):
        Context(task=5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="context tag"):
        Context(tags=("t" * (MAX_FIELD_CHARS + 1),))
    assert len(Context(tags=tuple(f"t{i}" for i in range(MAX_TAGS))).tags) == MAX_TAGS
    from forge.model import Provenance

    with pytest.raises(ValidationError, match="provenance.episodes"):
        Provenance(episodes=("e",) * 1001)
    with pytest.raises(ValidationError, match="provenance.source"):
        Provenance(source=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"id": None}, "episode id"),
        ({"id": ""}, "episode id"),
        ({"steps": 5}, "steps"),
        ({"steps": [5]}, "step must be"),
        ({"steps": [{"reward": "lots"}]}, "reward"),
        ({"steps": [{"action": 3}]}, "action"),
        ({"created_at": "yesterday"}, "created_at"),
        ({"outcome": [1]}, "outcome"),
        ({"agent": 7}, "agent"),
    ],
)
def test_episode_types(data, message):
    with pytest.raises(ValidationError, match=message):
        Episode.from_dict({"id": "e1", **data})


def test_relation_types():
    with pytest.raises(ValidationError, match="note"):
        Relation.from_dict({"src": "a", "dst": "b", "note": {}})
    with pytest.raises(ValidationError, match="weight"):
        Relation("a", "b", weight="heavy")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Relation.from_dict({"src": ["a"], "dst": "b"})


def test_limits_accept_what_they_document():
    meta = {"blob": "y" * (MAX_META_BYTES - 20)}
    u = Unit("x" * MAX_CONTENT_CHARS, owner="o" * MAX_FIELD_CHARS, meta=meta)
    assert Unit.from_dict(u.to_dict()) == u


def test_restore_rebuilds_a_stored_unit_without_checking_it_again():
    """Stores rebuild units from rows validated when written (reads are hot): the result
    equals the validated unit, and every field must be given."""
    from forge.model import Context, Provenance, Unit

    made = Unit("thin ice ahead", kind="rule", scope="group:red", owner="a1", context=Context(domain="lake", tags=("ice",)),
                provenance=Provenance(source="reflection", episodes=("e1",)), meta={"n": 1})
    fields = {name: getattr(made, name) for name in Unit.__slots__}
    assert Unit.restore(**fields) == made
    with pytest.raises(KeyError):
        Unit.restore(**{k: v for k, v in fields.items() if k != "meta"})
