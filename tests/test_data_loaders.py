"""Loaders: round trips on fixtures written from the documented schemas; malformed files fail with file, line and
field, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.io import RecordError, read_jsonl, write_jsonl
from data.loaders import LOADERS, convert, load_amabench, load_generic, load_locomo, load_memoryarena
from data.schemas import Episode

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("fmt", "name", "count"),
    [("amabench", "amabench_small.jsonl", 2), ("locomo", "locomo_small.json", 1),
     ("memoryarena", "memoryarena_small.jsonl", 2)],
)
def test_fixtures_round_trip_through_jsonl(tmp_path: Path, fmt: str, name: str, count: int) -> None:
    episodes = convert(FIX / name, tmp_path / "out.jsonl", LOADERS[fmt])
    assert len(episodes) == count
    assert read_jsonl(tmp_path / "out.jsonl", Episode) == episodes
    again = load_generic(tmp_path / "out.jsonl")
    assert again == episodes


def test_amabench_fields_and_extras() -> None:
    first, second = load_amabench(FIX / "amabench_small.jsonl")
    assert first.domain == "Embodied AI" and len(first.trajectory) == 4
    assert first.qa_pairs[0].needle_turns == [1]
    assert first.qa_pairs[1].metadata == {"question_uuid": "u-2"}
    assert second.episode_id == "7" and second.qa_pairs[0].answer == "1"
    assert second.metadata["source_benchmark"] == "synthetic"


def test_locomo_conversion() -> None:
    (ep,) = load_locomo(FIX / "locomo_small.json")
    assert [t.action for t in ep.trajectory] == ["Caroline", "Melanie", "Caroline", "Melanie"]
    assert ep.trajectory[0].observation.startswith("[1:56 pm on 8 May, 2023] ")
    by_q = {q.question: q for q in ep.qa_pairs}
    assert by_q["How many kids does Melanie have?"].answer == "3"
    assert by_q["How many kids does Melanie have?"].needle_turns == [3]
    adversarial = by_q["What did Caroline paint?"]
    assert adversarial.type == "adversarial" and adversarial.metadata["adversarial_answer"] == "a lake"
    assert by_q["Where will Caroline move and what did Melanie paint?"].needle_turns == [1, 2]


def test_memoryarena_conversion() -> None:
    first, second = load_memoryarena(FIX / "memoryarena_small.jsonl")
    assert first.qa_pairs[1].answer == "Ana" and first.qa_pairs[1].metadata["alternatives"] == ["Ana", "Ana Smith"]
    assert len(second.trajectory) == 1 and second.qa_pairs[0].answer == "2021"


def test_generic_jsonl_with_renames_and_parquet(tmp_path: Path) -> None:
    (ep,) = load_generic(FIX / "generic_small.jsonl", {"id": "episode_id", "turns": "trajectory"})
    assert ep.episode_id == "g-1" and ep.qa_pairs[0].needle_turns == [0]
    import datasets

    from data.io import to_arrow_rows

    datasets.Dataset.from_list(to_arrow_rows([ep, ep.model_copy(update={"episode_id": "g-2"})])).to_parquet(
        str(tmp_path / "eps.parquet")
    )
    loaded = load_generic(tmp_path / "eps.parquet")
    assert [e.episode_id for e in loaded] == ["g-1", "g-2"] and loaded[0] == ep


def _ama(**override: object) -> dict:
    record = json.loads((FIX / "amabench_small.jsonl").read_text().split("\n")[0])
    record.update(override)
    return record


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["{not json"], r":2: invalid JSON"),
        ([{k: v for k, v in _ama().items() if k != "task"}], r":2: field 'task': missing"),
        ([_ama(trajectory=[{"turn_idx": "zero", "action": "a", "observation": "o"}])],
         r":2: field 'trajectory\[0\].turn_idx': expected integer, got string"),
        ([_ama(trajectory=[])], r":2: field 'trajectory': empty trajectory"),
        ([_ama(qa_pairs=[{"question": "q", "answer": None, "type": "A"}])],
         r":2: field 'qa_pairs\[0\].answer': expected string or integer or number, got null"),
        ([_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": 5}])],
         r":2: field 'qa_pairs\[0\].needle_turns': expected array, got integer"),
        ([_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": None}])],
         r":2: field 'qa_pairs\[0\].needle_turns': expected array, got null"),
        ([_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": [1, "2"]}])],
         r":2: field 'qa_pairs\[0\].needle_turns\[1\]': expected integer, got string"),
        ([_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": [True]}])],
         r":2: field 'qa_pairs\[0\].needle_turns\[0\]': expected integer, got boolean"),
        ([_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "qa_id": None}])],
         r":2: field 'qa_pairs\[0\].qa_id': expected string or integer or number, got null"),
        ([_ama(domain=["web"])], r":2: field 'domain': expected string or integer or number, got array"),
        ([_ama(task_type=None)], r":2: field 'task_type': expected string or integer or number, got null"),
    ],
)
def test_malformed_amabench_names_file_line_field_and_writes_nothing(
    tmp_path: Path, lines: list, expected: str
) -> None:
    src = tmp_path / "bad.jsonl"
    good = json.dumps(_ama(episode_id="ok"))
    src.write_text(good + "\n" + "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    dst = tmp_path / "out.jsonl"
    with pytest.raises(RecordError, match=str(src).replace(".", r"\.") + expected):
        convert(src, dst, load_amabench)
    assert not dst.exists() and list(tmp_path.iterdir()) == [src]


def test_non_utf8_bytes_name_the_line(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_bytes(json.dumps(_ama()).encode() + b"\n" + b'{"episode_id": "\xff\xfe"}\n')
    with pytest.raises(RecordError, match=r"bad\.jsonl:2: not UTF-8"):
        convert(src, tmp_path / "out.jsonl", load_amabench)
    assert not (tmp_path / "out.jsonl").exists()


def test_malformed_locomo_and_memoryarena(tmp_path: Path) -> None:
    sample = json.loads((FIX / "locomo_small.json").read_text())[0]
    sample["qa"][1]["category"] = 9
    bad = tmp_path / "locomo.json"
    bad.write_text(json.dumps([sample], indent=1))
    with pytest.raises(RecordError, match=r"locomo\.json:2: field 'qa\[1\]\.category': expected 1-5"):
        load_locomo(bad)
    sample["qa"][1]["category"] = 4
    sample["conversation"]["session_1"][0].pop("text")
    bad.write_text(json.dumps([sample]))
    with pytest.raises(RecordError, match=r"field 'conversation\.session_1\[0\]\.text': missing"):
        load_locomo(bad)
    ma = tmp_path / "ma.jsonl"
    ma.write_text(json.dumps({"id": "x", "questions": ["a", "b"], "answers": ["1"], "backgrounds": "bg"}) + "\n")
    with pytest.raises(RecordError, match=r"ma\.jsonl:1: field 'answers': 1 answers for 2 questions"):
        load_memoryarena(ma)
    ma.write_text(json.dumps({"id": "x", "questions": [], "answers": [], "backgrounds": []}) + "\n")
    with pytest.raises(RecordError, match="field 'backgrounds': empty trajectory"):
        load_memoryarena(ma)


def test_generic_validation_error_names_the_field(tmp_path: Path) -> None:
    src = tmp_path / "g.jsonl"
    turn = {"turn_idx": -1, "action": "", "observation": ""}
    write_jsonl(src, [{"episode_id": "a", "task": "t", "trajectory": [turn]}])
    with pytest.raises(RecordError, match=r"g\.jsonl:1: field 'trajectory\[0\]\.turn_idx'"):
        load_generic(src)


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [([3], r"field 'qa\[1\]\.evidence\[0\]': expected string, got integer"),
     (["D2:2", None], r"field 'qa\[1\]\.evidence\[1\]': expected string, got null"),
     ("D2:2", r"field 'qa\[1\]\.evidence': expected array, got string")],
)
def test_locomo_evidence_that_is_not_a_string_fails_and_writes_nothing(
    tmp_path: Path, evidence: object, expected: str
) -> None:
    sample = json.loads((FIX / "locomo_small.json").read_text())[0]
    sample["qa"][1]["evidence"] = evidence
    src = tmp_path / "locomo.json"
    src.write_text(json.dumps([sample], indent=1))
    with pytest.raises(RecordError, match=r"locomo\.json:2: " + expected):
        convert(src, tmp_path / "out.jsonl", load_locomo)
    assert list(tmp_path.iterdir()) == [src]


def test_memoryarena_task_of_the_wrong_type_fails(tmp_path: Path) -> None:
    ma = tmp_path / "ma.jsonl"
    record = {"id": "x", "questions": ["q"], "answers": ["a"], "backgrounds": "bg", "task": None}
    ma.write_text(json.dumps(record) + "\n")
    with pytest.raises(RecordError, match=r"ma\.jsonl:1: field 'task': expected string or integer or number, got null"):
        convert(ma, tmp_path / "out.jsonl", load_memoryarena)
    assert list(tmp_path.iterdir()) == [ma]
