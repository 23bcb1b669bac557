from frontier_llm.catalog import load_model
from frontier_llm.specs import ParallelConfig
from frontier_llm.specs.identity import layout_hash


def test_same_layout_same_hash_and_differences_change_it():
    model = load_model("gpt-22b")
    a = ParallelConfig(tp=8, global_batch=4, micro_batch=4)
    assert layout_hash(model, "dgx-a100", a) == layout_hash(model, "dgx-a100", a.to_dict())
    assert layout_hash(model, "dgx-a100", a) != layout_hash(model, "frontier", a)
    b = ParallelConfig(tp=8, global_batch=4, micro_batch=2)
    assert layout_hash(model, "dgx-a100", a) != layout_hash(model, "dgx-a100", b)
    renamed = model.__class__(**{**model.to_dict(), "name": "other", "description": "x"})
    assert layout_hash(renamed, "dgx-a100", a) == layout_hash(model, "dgx-a100", a)
