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
