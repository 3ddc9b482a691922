"""The CLI end to end, in-process: commands, JSON output, and bad input handling."""

from __future__ import annotations

import json
import sqlite3

import pytest

from forge.cli import cli, main


def run(capsys, *args):
    """Run ``forge ARGS``; returns (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "m.db")


def add(capsys, db, content, *extra):
    code, out, err = run(capsys, "--db", db, "--embedder", "hash", "--json", "add", content, *extra)
    assert code == 0, err
    return json.loads(out)["id"]


def test_add_recall_show_relate_stats(capsys, db):
    a = add(capsys, db, "When the taxi is empty, then never drop off", "--kind", "rule", "--tag", "taxi")
    b = add(capsys, db, "Dropping off an empty taxi costs ten points", "--kind", "fact")
    code, out, _ = run(capsys, "--db", db, "relate", b, "supports", a)
    assert code == 0 and "supports" in out
    code, out, _ = run(capsys, "--db", db, "--json", "recall", "empty taxi drop off", "-k", "2")
    data = json.loads(out)
    assert code == 0 and {d["id"] for d in data} == {a, b} and all(d["reasons"] for d in data)
    code, out, _ = run(capsys, "--db", db, "recall", "taxi", "--kind", "rule", "--budget", "40")
    assert code == 0 and "## Rules" in out and "tokens" in out
    code, out, _ = run(capsys, "--db", db, "show", a)
    assert code == 0 and "supports" in out and "event #" in out
    code, out, _ = run(capsys, "--db", db, "--json", "stats")
    s = json.loads(out)
    assert s["units"] == 2 and s["relations"] == 1 and s["embedder"] == "hash:256"


def test_private_units_hidden_from_other_agents(capsys, db):
    add(capsys, db, "alice keeps the spare key in the boot", "--scope", "private", "--owner", "alice")
    code, out, _ = run(capsys, "--db", db, "--json", "recall", "spare key", "--agent", "bob")
    assert code == 0 and json.loads(out) == []
    code, out, _ = run(capsys, "--db", db, "--json", "recall", "spare key", "--agent", "alice")
    assert len(json.loads(out)) == 1


def test_export_import_round_trip(capsys, db, tmp_path):
    a = add(capsys, db, "first unit", "--kind", "lesson")
    b = add(capsys, db, "second unit", "--derived-from", a)
    dump = tmp_path / "dump.jsonl"
    assert run(capsys, "--db", db, "export", str(dump))[0] == 0
    db2 = str(tmp_path / "copy.db")
    code, out, err = run(capsys, "--db", db2, "--embedder", "hash", "import", str(dump))
    assert code == 2 and "--with-history" in err  # the admission decisions are audit history: restored only when asked
    code, out, err = run(capsys, "--db", db2, "--embedder", "hash", "import", "--with-history", str(dump))
    assert code == 0, err
    dump2 = tmp_path / "dump2.jsonl"
    run(capsys, "--db", db2, "export", str(dump2))
    assert dump.read_text() == dump2.read_text()
    # the embedder's name travels as a setting, so the copy reopens with the same one; the
    # admission decisions travel as events
    assert {json.loads(line)["record"] for line in dump.read_text().splitlines()} == {"unit", "relation", "setting", "event"}
    assert b in dump.read_text()


def assert_one_line_error(code, err, expected_code, *fragments):
    assert code == expected_code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]


def test_malformed_jsonl_imports_nothing(capsys, db, tmp_path):
    add(capsys, db, "existing")
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"record": "unit", "content": "fine"})
    bad.write_text(good + "\n" + good + "\n{not json\n")
    code, _, err = run(capsys, "--db", db, "import", str(bad))
    assert_one_line_error(code, err, 2, "bad.jsonl:3", "malformed JSON")
    bad.write_text(good + "\n" + json.dumps({"record": "unit", "content": "x", "kind": "dream"}) + "\n")
    code, _, err = run(capsys, "--db", db, "import", str(bad))
    assert_one_line_error(code, err, 2, "record 2", "unknown kind")
    bad.write_text(good + "\n" + json.dumps({"record": "relation", "src": "a", "dst": "b", "type": "supports"}) + "\n")
    code, _, err = run(capsys, "--db", db, "import", str(bad))
    assert_one_line_error(code, err, 2, "no unit with id")
    code, out, _ = run(capsys, "--db", db, "--json", "stats")
    assert json.loads(out)["units"] == 1


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["add", ""], ["empty"]),
        (["add", "x" * 20000], ["limit"]),
        (["add", "x", "--scope", "private"], ["owner"]),
        (["add", "x", "--confidence", "3"], ["between 0 and 1"]),
        (["add", "x", "--meta", "[1]"], ["--meta must be a JSON object"]),
        (["add", "x", "--derived-from", "ghost"], ["ghost"]),
        (["relate", "ghost", "supports", "other"], ["no unit with id"]),
        (["show", "ghost"], ["no unit with id ghost"]),
    ],
)
def test_bad_input_one_line_and_nothing_written(capsys, db, args, fragments):
    add(capsys, db, "seed unit")
    code, _, err = run(capsys, "--db", db, *args)
    assert_one_line_error(code, err, 2, *fragments)
    code, out, _ = run(capsys, "--db", db, "--json", "stats")
    assert json.loads(out)["units"] == 1


def test_unknown_kind_and_relation_are_usage_errors(capsys, db):
    add(capsys, db, "seed")
    code, _, err = run(capsys, "--db", db, "add", "x", "--kind", "dream")
    assert code == 2 and "dream" in err
    code, _, err = run(capsys, "--db", db, "relate", "a", "likes", "b")
    assert code == 2 and "likes" in err


def test_wrong_embedding_dimension(capsys, db):
    add(capsys, db, "built with 256-d hashing")
    code, _, err = run(capsys, "--db", db, "--embedder", "hash:64", "recall", "x")
    assert_one_line_error(code, err, 2, "hash:256")


def test_corrupt_and_foreign_databases(capsys, tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00garbage" * 100)
    code, _, err = run(capsys, "--db", str(junk), "stats")
    assert_one_line_error(code, err, 1, "not a FORGE database")
    assert junk.read_bytes() == b"\x00garbage" * 100
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.commit()
    con.close()
    before = foreign.read_bytes()
    code, _, err = run(capsys, "--db", str(foreign), "--embedder", "hash", "add", "x")
    assert_one_line_error(code, err, 1, "another application")
    assert foreign.read_bytes() == before
    truncated = tmp_path / "trunc.db"
    truncated.write_bytes(b"SQLite format 3\x00" + b"\xff" * 50)
    code, _, err = run(capsys, "--db", str(truncated), "stats")
    assert code == 1 and err.startswith("error: ")


def test_missing_database_is_reported(capsys, tmp_path):
    code, _, err = run(capsys, "--db", str(tmp_path / "none.db"), "recall", "x")
    assert_one_line_error(code, err, 2, "no such database")
    assert not (tmp_path / "none.db").exists()


def test_every_command_is_documented():
    for name, cmd in cli.commands.items():
        assert cmd.help, f"forge {name} has no help text"


# -- issue 9: no tracebacks, user errors exit 2 with one line ----------------------------


def test_invalid_utf8_in_any_argument(capsys, db):
    add(capsys, db, "seed")
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 byte
    for args in (["add", bad], ["recall", bad], ["--db", db, "show", bad], ["add", "x", "--tag", bad]):
        code, _, err = run(capsys, "--db", db, *args)
        assert_one_line_error(code, err, 2, "not valid UTF-8")
    code, out, _ = run(capsys, "--db", db, "--json", "stats")
    assert json.loads(out)["units"] == 1


@pytest.mark.parametrize("k", ["100000000000000000000", "0", "-3", "99999999"])
def test_absurd_k_is_a_user_error(capsys, db, k):
    add(capsys, db, "seed")
    code, _, err = run(capsys, "--db", db, "recall", "seed", "-k", k)
    assert_one_line_error(code, err, 2, "k must be")


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({"record": "episode", "id": "e1", "steps": 5}, "steps"),
        ({"record": "episode", "id": None}, "episode id"),
        ({"record": "episode", "id": "e1", "created_at": "yesterday"}, "created_at"),
        ({"record": "unit", "content": "x", "owner": ["a"]}, "owner"),
        ({"record": "unit", "content": "x", "owner": 7}, "owner"),
        ({"record": "unit", "content": "x", "created_at": "yesterday"}, "created_at"),
        ({"record": "unit", "content": "x", "vector": 5}, "vector"),
        ({"record": "unit", "content": "x", "context": {"tags": [f"t{i}" for i in range(100_000)]}}, "tags"),
        ({"record": "unit", "content": "x", "meta": {"blob": "y" * 10_000_000}}, "meta"),
        ({"record": "unit", "content": "\ud800"}, "surrogate"),
        ({"record": "unit", "content": "x", "context": {"domain": "d" * 1_000_000}}, "context.domain"),
        ({"record": "relation", "src": "a", "dst": "b", "note": {}}, "note"),
        ({"record": "relation", "src": ["a"], "dst": "b"}, "relation"),
        ({"record": "unit", "content": "x", "meta": []}, "meta"),
        ([1, 2], "JSON object"),
    ],
)
@pytest.mark.slow
def test_imports_with_wrong_field_types(capsys, db, tmp_path, record, fragment):
    add(capsys, db, "seed")
    bad = tmp_path / "bad.jsonl"
    good = {"record": "unit", "content": "fine", "vector": None}
    good.pop("vector")
    bad.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    code, _, err = run(capsys, "--db", db, "--embedder", "hash", "import", str(bad))
    assert_one_line_error(code, err, 2, fragment)
    code, out, _ = run(capsys, "--db", db, "--json", "stats")
    assert json.loads(out)["units"] == 1


def test_non_utf8_stdin_and_directories(capsys, db, tmp_path, monkeypatch):
    import io

    add(capsys, db, "seed")

    class Stdin:
        buffer = io.BytesIO(b'{"record": "unit", "content": "caf\xe9"}\n')

    monkeypatch.setattr("sys.stdin", Stdin())
    code, _, err = run(capsys, "--db", db, "import", "-")
    assert_one_line_error(code, err, 2, "standard input", "not UTF-8")
    code, _, err = run(capsys, "--db", db, "import", str(tmp_path))
    assert_one_line_error(code, err, 2, "is a directory")
    code, _, err = run(capsys, "--db", db, "export", str(tmp_path / "missing" / "dump.jsonl"))
    assert_one_line_error(code, err, 2, "no such directory")
    target = tmp_path / "adir"
    target.mkdir()
    code, _, err = run(capsys, "--db", db, "export", str(target))
    assert_one_line_error(code, err, 2, "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []
    assert list(target.iterdir()) == []


def test_export_failure_leaves_no_temporary_file(capsys, db, tmp_path, monkeypatch):
    add(capsys, db, "seed")
    out = tmp_path / "out"
    out.mkdir()
    dump = out / "dump.jsonl"

    def boom(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("forge.cli.os.replace", boom)
    code, _, err = run(capsys, "--db", db, "export", str(dump))
    assert_one_line_error(code, err, 2, "No space left")
    assert list(out.iterdir()) == []


def test_an_unexpected_exception_is_one_line_not_a_traceback(capsys, db, monkeypatch):
    add(capsys, db, "seed")

    def bug(*_a, **_k):
        raise KeyError("oops")

    monkeypatch.setattr("forge.engine.memory.Memory.stats", bug)
    code, _, err = run(capsys, "--db", db, "stats")
    assert_one_line_error(code, err, 1, "internal error", "KeyError")
    assert "Traceback" not in err


def test_show_as_an_agent_leaks_nothing_it_may_not_see(capsys, db):
    """Relations to another agent's private units and the private history of a unit that
    was shared later are not shown to an agent that may see only the shared unit."""
    from forge.engine.memory import Memory
    from forge.model import Viewer

    secret = add(capsys, db, "alice's private launch code is 0000", "--scope", "private", "--owner", "alice")
    public = add(capsys, db, "a public note", "--scope", "private", "--owner", "alice")
    run(capsys, "--db", db, "relate", public, "related_to", secret, "--note", "see alice's code 0000")
    with Memory.open(db) as mem:
        unit = mem.get(public, viewer=Viewer.admin())
        mem.update(unit.replace(content="the shared note", scope="global"), actor="alice")
    code, out, err = run(capsys, "--db", db, "--json", "show", public, "--agent", "bob")
    assert code == 0, err
    assert secret not in out and "0000" not in out and "a public note" not in out
    data = json.loads(out)
    assert data["relations"] == []
    assert [e["op"] for e in data["events"]] == ["add", "admit", "update"]
    code, out, _ = run(capsys, "--db", db, "--json", "show", public)  # the operator sees all
    assert secret in out and "a public note" in out
    code, out, _ = run(capsys, "--db", db, "export", "-", "--agent", "bob")
    assert secret not in out and "0000" not in out and public in out
