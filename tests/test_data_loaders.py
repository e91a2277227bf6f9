"""Loaders: round trips on fixtures written from the documented schemas; malformed files fail with file, line and
field, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_files import write_amabench, write_locomo, write_memoryarena
from pydantic import ValidationError

from memrl.data.io import RecordError, read_arrow, read_jsonl, write_arrow, write_jsonl
from memrl.data.loaders import LOADERS, convert, load_amabench, load_generic, load_locomo, load_memoryarena
from memrl.data.loaders.formats import LOCOMO_DATE_INSTRUCTION, LOCOMO_NOT_MENTIONED
from memrl.data.schemas import Episode, turn_steps

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("fmt", "name", "count"),
    [
        ("amabench", "amabench_small.jsonl", 2),
        ("locomo", "locomo_small.json", 1),
        ("memoryarena", "memoryarena_small.jsonl", 2),
    ],
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

    from memrl.data.io import to_arrow_rows

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
        ([_ama(task=["x"])], r":2: field 'task': expected string or integer or number, got array"),
        (
            [_ama(trajectory=[{"turn_idx": "zero", "action": "a", "observation": "o"}])],
            r":2: field 'trajectory\[0\].turn_idx': expected integer, got string",
        ),
        ([_ama(trajectory=[])], r":2: field 'trajectory': empty trajectory"),
        (
            [_ama(qa_pairs=[{"question": "q", "answer": None, "type": "A"}])],
            r":2: field 'qa_pairs\[0\].answer': expected string or integer or number, got null",
        ),
        (
            [_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": 5}])],
            r":2: field 'qa_pairs\[0\].needle_turns': expected array, got integer",
        ),
        (
            [_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": None}])],
            r":2: field 'qa_pairs\[0\].needle_turns': expected array, got null",
        ),
        (
            [_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": [1, "2"]}])],
            r":2: field 'qa_pairs\[0\].needle_turns\[1\]': expected integer, got string",
        ),
        (
            [_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "needle_turns": [True]}])],
            r":2: field 'qa_pairs\[0\].needle_turns\[0\]': expected integer, got boolean",
        ),
        (
            [_ama(qa_pairs=[{"question": "q", "answer": "a", "type": "A", "qa_id": None}])],
            r":2: field 'qa_pairs\[0\].qa_id': expected string or integer or number, got null",
        ),
        ([_ama(domain=["web"])], r":2: field 'domain': expected string or integer or number, got array"),
        ([_ama(task_type=["web"])], r":2: field 'task_type': expected string or integer or number, got array"),
        # given indices still must increase, also around turns that give none
        (
            [
                _ama(
                    trajectory=[
                        {"turn_idx": 3, "action": "a", "observation": "o"},
                        {"turn_idx": 1, "action": "b", "observation": "p"},
                    ]
                )
            ],
            r":2: field 'trajectory': turn_idx must increase, got 3 then 1",
        ),
        (
            [
                _ama(
                    trajectory=[
                        {"turn_idx": 5, "action": "a", "observation": "o"},
                        {"action": "b", "observation": "p"},
                        {"turn_idx": 5, "action": "c", "observation": "q"},
                    ]
                )
            ],
            r":2: field 'trajectory': turn_idx must increase, got 5 then 5",
        ),
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
    with pytest.raises(RecordError, match="field 'questions': no subtasks"):
        load_memoryarena(ma)


def test_generic_validation_error_names_the_field(tmp_path: Path) -> None:
    src = tmp_path / "g.jsonl"
    turn = {"turn_idx": -1, "action": "", "observation": ""}
    write_jsonl(src, [{"episode_id": "a", "task": "t", "trajectory": [turn]}])
    with pytest.raises(RecordError, match=r"g\.jsonl:1: field 'trajectory\[0\]\.turn_idx'"):
        load_generic(src)


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        ([3], r"field 'qa\[1\]\.evidence\[0\]': expected string, got integer"),
        (["D2:2", None], r"field 'qa\[1\]\.evidence\[1\]': expected string, got null"),
        ("D2:2", r"field 'qa\[1\]\.evidence': expected array, got string"),
    ],
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


# ----------------------------------------------------------------------------------------------------------------
# Files in the benchmarks' real formats (tests/benchmark_files.py): every field kept as the official code keeps it


def test_locomo_real_format_keeps_captions_evidence_and_both_adversarial_answers(tmp_path: Path) -> None:
    (ep,) = load_locomo(write_locomo(tmp_path / "locomo10.json"))
    turns = ep.metadata["turns"]
    image = ep.trajectory[turns["D2:1"]["turn_idx"]]
    # the official prompts read an image turn as '<text> and shared <blip_caption>'
    assert image.observation == (
        "[1:14 pm on 25 May, 2023] Look at this, I am researching adoption agencies now. "
        "and shared a photo of a stack of brochures"
    )
    assert turns["D2:1"]["img_url"] == ["https://example.org/adoption.jpg"]
    assert turns["D2:1"]["query"] == "adoption brochures" and turns["D2:1"]["session"] == 2
    assert ep.trajectory[0].observation.startswith("[1:56 pm on 8 May, 2023] ")
    assert ep.metadata["speakers"] == ["Caroline", "Melanie"]
    assert set(ep.metadata) >= {"observation", "session_summary", "event_summary", "session_dates"}
    by_q = {q.question: q for q in ep.qa_pairs}
    multi = by_q["Where did Caroline's necklace come from and what class did Melanie sign up for?"]
    assert multi.needle_turns == [turns["D3:3"]["turn_idx"], turns["D3:6"]["turn_idx"]]  # "D3:3 D3:6"
    assert "unresolved_evidence" not in multi.metadata and multi.metadata["evidence_ids"] == ["D3:3 D3:6"]
    mixed = by_q["What did Caroline share and Melanie paint?"]  # "D2:1; D1:5"
    assert mixed.needle_turns == sorted([turns["D2:1"]["turn_idx"], turns["D1:5"]["turn_idx"]])
    assert by_q["How many kids does Melanie have?"].answer == "3"
    temporal = by_q["When did Caroline go to the LGBTQ support group?"]
    assert temporal.metadata["asked_as"] == temporal.question + LOCOMO_DATE_INSTRUCTION
    assert "asked_as" not in by_q["What did Melanie paint?"].metadata
    both = by_q["What did Caroline's mentor give her brother?"]
    assert both.answer == LOCOMO_NOT_MENTIONED and both.type == "adversarial"
    assert both.metadata["answer"] == "a necklace" and both.metadata["adversarial_answer"] == "a necklace"
    only_trap = by_q["What did Melanie paint in her kitchen?"]
    assert "answer" not in only_trap.metadata and only_trap.metadata["adversarial_answer"] == "a lake sunrise"
    options = only_trap.metadata["options"]
    assert sorted(options.values()) == sorted([LOCOMO_NOT_MENTIONED, "a lake sunrise"])
    assert only_trap.metadata["asked_as"].endswith(
        f"Select the correct answer: (a) {options['a']} (b) {options['b']}. "
    )
    # the same file loads the same way (the option order is fixed by the question id)
    assert load_locomo(tmp_path / "locomo10.json") == [ep]


def test_amabench_real_format_takes_the_official_defaults_and_records_them(tmp_path: Path) -> None:
    first, second = load_amabench(write_amabench(tmp_path / "open_end_qa_set.jsonl"))
    assert first.episode_id == "3" and first.domain == "GAME"
    qa = first.qa_pairs
    assert qa[0].type == "A" and "loader_defaults" not in qa[0].metadata
    assert qa[1].type == "unknown" and qa[1].metadata["loader_defaults"] == ["qa_pairs[1].type: missing -> 'unknown'"]
    assert qa[2].type == "unknown" and qa[2].metadata["loader_defaults"] == ["qa_pairs[2].type: null -> 'unknown'"]
    # a list answer reads as the official judge prompt prints it, and the list is kept
    assert qa[3].answer == "['key', 'chest']" and qa[3].metadata["answer_list"] == ["key", "chest"]
    assert qa[3].metadata["loader_defaults"] == ["qa_pairs[3].answer: list -> \"['key', 'chest']\""]
    assert second.trajectory[0].turn_idx == 0
    assert second.task_type == "unknown" and second.domain == "unknown"
    assert second.metadata["loader_defaults"] == [
        "trajectory[0].turn_idx: missing -> 0",
        "task_type: missing -> 'unknown'",
        "domain: missing -> 'unknown'",
    ]
    assert second.qa_pairs[0].answer == "Sakura"


def test_amabench_null_task_type_is_accepted_and_leaves_the_judge_line_out(tmp_path: Path) -> None:
    """The official loader takes ``task_type: null``; its judge prompt then has no Task Type line."""
    from memrl.rewards.scorers import render_ama_judge

    src = tmp_path / "null_type.jsonl"
    src.write_text(json.dumps(_ama(episode_id="n", task_type=None)) + "\n")
    (episode,) = load_amabench(src)
    assert episode.task_type == "" and episode.metadata["loader_defaults"] == ["task_type: null -> ''"]
    prompt = render_ama_judge("q", "a", "a", episode.task, episode.task_type, episode.episode_id)
    assert "Task Type" not in str(prompt)
    assert "Task Type: x" in str(render_ama_judge("q", "a", "a", episode.task, "x", episode.episode_id))


def test_amabench_turns_without_turn_idx_read_0_as_the_official_loader_and_keep_their_order(tmp_path: Path) -> None:
    """The official ``_trajectory_to_text`` reads ``step.get("turn_idx", 0)``: every such turn is ``Step 0``."""
    record = _ama(
        trajectory=[
            {"action": "a", "observation": "o"},
            {"action": "b", "observation": "p"},
            {"turn_idx": 7, "action": "c", "observation": "q"},
            {"action": "d"},
        ]
    )
    src = tmp_path / "ama.jsonl"
    src.write_text(json.dumps(record) + "\n")
    (ep,) = load_amabench(src)
    assert [t.turn_idx for t in ep.trajectory] == [0, 0, 7, 0]
    assert [t.action for t in ep.trajectory] == ["a", "b", "c", "d"] and ep.unnumbered_turns == [0, 1, 3]
    assert ep.trajectory[3].observation == ""
    assert "trajectory[1].turn_idx: missing -> 0" in ep.metadata["loader_defaults"]
    assert "trajectory[3].observation: missing -> ''" in ep.metadata["loader_defaults"]
    # memory steps stay distinct and in order; where indices increase they are the indices
    assert turn_steps(ep.trajectory) == [0, 1, 7, 8]
    assert turn_steps(load_amabench(write_amabench(tmp_path / "numbered.jsonl"))[0].trajectory) == [0, 1, 2, 3]
    # the episode round-trips through JSONL and Arrow with its unnumbered turns
    assert read_jsonl(write_jsonl(tmp_path / "ep.jsonl", [ep]), Episode) == [ep]
    assert read_arrow(write_arrow(tmp_path / "ep.arrow", [ep]), Episode) == [ep]


def test_unnumbered_turns_exempt_only_the_turns_they_name() -> None:
    turns = [{"turn_idx": 0, "action": "a", "observation": "o"}, {"turn_idx": 0, "action": "b", "observation": "p"}]
    with pytest.raises(ValidationError, match="turn_idx must increase, got 0 then 0"):
        Episode(episode_id="e", task="t", trajectory=turns)
    assert Episode(episode_id="e", task="t", trajectory=turns, unnumbered_turns=[1]).unnumbered_turns == [1]
    numbered = [{"turn_idx": 4, "action": "a", "observation": "o"}, {"turn_idx": 0, "action": "b", "observation": "p"}]
    with pytest.raises(ValidationError, match="listed in unnumbered_turns but has turn_idx 4"):
        Episode(episode_id="e", task="t", trajectory=numbered, unnumbered_turns=[0])
    with pytest.raises(ValidationError, match="position 2, past the 2-turn trajectory"):
        Episode(episode_id="e", task="t", trajectory=turns, unnumbered_turns=[1, 2])


def test_memoryarena_real_format(tmp_path: Path) -> None:
    formal, travel, search = load_memoryarena(write_memoryarena(tmp_path / "tasks.jsonl"))
    assert formal.episode_id == "0" and formal.metadata["paper_name"] == "paper-17"
    assert [t.action for t in formal.trajectory] == ["read background of subtask 1", "read background of subtask 2"]
    assert [q.answer for q in formal.qa_pairs] == ["7", "49"] and formal.qa_pairs[1].metadata["subtask"] == 2
    assert travel.metadata["base_person"]["name"] == "Jennifer" and len(travel.trajectory) == 1
    assert [t.observation for t in search.trajectory] == [q.question for q in search.qa_pairs]
    assert search.metadata["loader_defaults"] == ["backgrounds: none -> the subtask prompts are the turns"]
    assert search.qa_pairs[1].answer == "MIT"
    assert search.qa_pairs[1].metadata["alternatives"] == ["MIT", "Massachusetts Institute of Technology"]
