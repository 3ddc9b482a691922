import json

from forge.engine.rerank import LLMReranker
from forge.llm.testing import ScriptedLLM
from forge.model import Unit, Viewer


def test_llm_reranker_reorders_by_grade(memory):
    a, b, c = Unit("apples are red"), Unit("apples grow on trees"), Unit("apple pie recipe")
    memory.add([a, b, c])
    fused = memory.recall("apples", viewer=Viewer.admin(), k=3)
    order = [r.unit.id for r in fused]
    grades = {a.id: 1, b.id: 10, c.id: 5}
    llm = ScriptedLLM([json.dumps({"scores": [grades[i] for i in order]})])
    out = LLMReranker(llm)("apples", fused)
    assert out[0].unit.id == b.id and out[0].why["rerank"] == 1.0
    assert len(llm.requests) == 1


def test_llm_reranker_keeps_order_when_model_answers_badly(memory):
    memory.add([Unit("one thing"), Unit("one other thing")])
    fused = memory.recall("one thing", viewer=Viewer.admin(), k=2)
    llm = ScriptedLLM(["no idea"] * 5)
    out = LLMReranker(llm)("one thing", fused)
    assert [r.unit.id for r in out] == [r.unit.id for r in fused]
