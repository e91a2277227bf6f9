from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.data.io import RecordError, append_jsonl, read_arrow, read_jsonl, write_arrow, write_jsonl
from memrl.data.schemas import (
    EnvSpec,
    Episode,
    Group,
    GroupSample,
    MemoryCall,
    MemoryCallTree,
    Message,
    QAPair,
    TokenUsage,
    TreeNode,
    Turn,
)

text = st.text(max_size=30)
ident = st.text(alphabet="abcdefghij0123456789-_", min_size=1, max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), finite, text)
json_value = st.recursive(
    json_scalar,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(text, children, max_size=3)),
    max_leaves=8,
)
json_dict = st.dictionaries(text, json_value, max_size=3)
messages = st.lists(
    st.builds(Message, role=st.sampled_from(["system", "user", "assistant", "tool"]), content=text), max_size=3
)


@st.composite
def memory_calls(draw: st.DrawFn) -> MemoryCall:
    response = draw(st.lists(st.integers(0, 50_000), max_size=8))
    logprobs = draw(st.one_of(st.just([]), st.lists(finite, min_size=len(response), max_size=len(response))))
    return MemoryCall(
        call_id=draw(ident),
        role=draw(st.sampled_from(["recall", "consolidate", "bank_edit", "intervene"])),
        messages=draw(messages),
        prompt_ids=draw(st.lists(st.integers(0, 50_000), max_size=8)),
        response_ids=response,
        logprobs=logprobs,
        text=draw(text),
        finish_reason=draw(st.sampled_from(["stop", "length"])),
        policy_version=draw(st.integers(0, 100)),
        step=draw(st.integers(0, 1000)),
        prompt_tokens=draw(st.integers(0, 10_000)),
        completion_tokens=draw(st.integers(0, 10_000)),
        error=draw(st.one_of(st.none(), text)),
        metadata=draw(json_dict),
    )


@st.composite
def episodes(draw: st.DrawFn) -> Episode:
    n = draw(st.integers(0, 4))
    turns = [Turn(turn_idx=i, action=draw(text), observation=draw(text)) for i in range(n)]
    qas = draw(
        st.lists(
            st.builds(
                QAPair,
                question=text,
                answer=text,
                type=st.sampled_from("ABCD"),
                needle_turns=st.lists(st.integers(0, 10), max_size=3),
                qa_id=st.one_of(st.none(), ident),
                metadata=json_dict,
            ),
            max_size=3,
        )
    )
    env = draw(st.one_of(st.none(), st.builds(EnvSpec, name=ident, seed=st.integers(0, 2**31), params=json_dict)))
    return Episode(
        episode_id=draw(ident),
        task=draw(text),
        task_type=draw(text),
        domain=draw(text),
        trajectory=turns,
        qa_pairs=qas,
        env=env,
        horizon_tokens=draw(st.one_of(st.none(), st.integers(0, 10**6))),
        metadata=draw(json_dict),
    )


@st.composite
def trees(draw: st.DrawFn) -> MemoryCallTree:
    n = draw(st.integers(1, 6))
    parents = [None] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    children: dict[int, list[str]] = {i: [] for i in range(n)}
    for i, p in enumerate(parents):
        if p is not None:
            children[p].append(f"n{i}")
    opt = st.one_of(st.none(), finite)
    nodes = [
        TreeNode(
            node_id=f"n{i}",
            parent_id=None if p is None else f"n{p}",
            depth=0 if p is None else 1,
            kind="root" if p is None else ("leaf" if not children[i] else "memory"),
            call=draw(st.one_of(st.none(), memory_calls())) if p is not None else None,
            children=children[i],
            group_id=None if p is None else f"g{p}",
            outcome=draw(opt),
            value=draw(opt),
            committee_score=draw(opt),
            reward=draw(opt),
            advantage=draw(opt),
            answer=draw(st.one_of(st.none(), text)),
            reasoner_usage=TokenUsage(prompt_tokens=draw(st.integers(0, 99)), completion_tokens=1, calls=1),
        )
        for i, p in enumerate(parents)
    ]
    return MemoryCallTree(
        tree_id=draw(ident),
        task_id=draw(ident),
        root_id="n0",
        nodes=nodes,
        reasoner_usage=TokenUsage(prompt_tokens=5),
        config_hash="abc",
        metadata=draw(json_dict),
    )


@st.composite
def groups(draw: st.DrawFn) -> Group:
    def sample() -> GroupSample:
        ids = draw(st.lists(st.integers(0, 999), min_size=1, max_size=6))
        return GroupSample(
            response_ids=ids,
            rollout_logprobs=draw(st.lists(finite, min_size=len(ids), max_size=len(ids))),
            text=draw(text),
            reward=draw(finite),
            advantage=draw(finite),
            node_id=draw(st.one_of(st.none(), ident)),
            policy_version=draw(st.integers(0, 9)),
            metadata=draw(json_dict),
        )

    k = draw(st.integers(1, 4))
    return Group(
        group_id=draw(ident),
        task_id=draw(ident),
        role="recall",
        prompt_ids=draw(st.lists(st.integers(0, 999), max_size=6)),
        messages=draw(messages),
        samples=[sample() for _ in range(k)],
        source=draw(st.sampled_from(["oat", "flat", "pivot"])),
        metadata=draw(json_dict),
    )


# (writer, reader, file name, examples per model): Arrow datasets are slower to write, so fewer examples
FORMATS = {"jsonl": (write_jsonl, read_jsonl, "r.jsonl", 25), "arrow": (write_arrow, read_arrow, "ds", 8)}


@pytest.mark.parametrize(
    "fmt, strategy, model",
    [
        ("jsonl", episodes(), Episode),
        ("jsonl", memory_calls(), MemoryCall),
        ("jsonl", trees(), MemoryCallTree),
        ("jsonl", groups(), Group),
        ("arrow", episodes(), Episode),
        ("arrow", trees(), MemoryCallTree),
        ("arrow", groups(), Group),
    ],
)
def test_records_round_trip(tmp_path: Path, fmt: str, strategy: st.SearchStrategy, model: type) -> None:
    write, read, name, examples = FORMATS[fmt]

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(strategy, min_size=1, max_size=3))
    def check(records: list) -> None:
        path = tmp_path / name
        write(path, records)
        assert read(path, model) == records

    check()


def good_episode() -> dict:
    return Episode(
        episode_id="e1",
        task="t",
        trajectory=[Turn(turn_idx=0, action="a", observation="o")],
        qa_pairs=[QAPair(question="q", answer="a", type="A", needle_turns=[0])],
    ).model_dump(mode="json")


def test_malformed_record_names_file_line_field(tmp_path: Path) -> None:
    bad = good_episode()
    bad["qa_pairs"][0]["answer"] = ["not", "a", "string"]
    path = tmp_path / "eps.jsonl"
    path.write_text(json.dumps(good_episode()) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError) as info:
        read_jsonl(path, Episode)
    msg = str(info.value)
    assert f"{path}:2" in msg and "qa_pairs[0].answer" in msg


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b'{"episode_id": "e1", "task": ', "invalid JSON"),
        (b'{"task": "t"}', "field 'episode_id': Field required"),
        (b'{"episode_id": "e1", "task": "t", "extra_field": 1}', "field 'extra_field'"),
        (
            b'{"episode_id": "e1", "task": "t", "trajectory": [{"turn_idx": "x", "action": "a", "observation": "o"}]}',
            "trajectory[0].turn_idx",
        ),
        (b'{"episode_id": "e1", "task": "\xff\xfe"}', "not UTF-8"),
        (b"[1, 2]", "field '<record>'"),
    ],
)
def test_malformed_inputs(tmp_path: Path, payload: bytes, fragment: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(json.dumps(good_episode()).encode() + b"\n" + payload + b"\n")
    with pytest.raises(RecordError) as info:
        read_jsonl(path, Episode)
    assert f"{path}:2" in str(info.value) and fragment in str(info.value)


def test_inconsistent_logprobs_rejected() -> None:
    with pytest.raises(ValueError, match="logprobs has 1 entries"):
        MemoryCall(call_id="c", role="recall", response_ids=[1, 2], logprobs=[-0.1])


def test_tree_structure_validated() -> None:
    root = TreeNode(node_id="r", kind="root", children=["a"])
    orphan = TreeNode(node_id="a", parent_id="zzz")
    with pytest.raises(ValueError, match="parent 'zzz' is not a node"):
        MemoryCallTree(tree_id="t", task_id="x", root_id="r", nodes=[root, orphan])


def test_tree_leaves_below() -> None:
    nodes = [
        TreeNode(node_id="r", kind="root", children=["a", "b"]),
        TreeNode(node_id="a", parent_id="r", children=["a1", "a2"]),
        TreeNode(node_id="b", parent_id="r", kind="leaf"),
        TreeNode(node_id="a1", parent_id="a", kind="leaf"),
        TreeNode(node_id="a2", parent_id="a", kind="leaf"),
    ]
    tree = MemoryCallTree(tree_id="t", task_id="x", root_id="r", nodes=nodes)
    assert [n.node_id for n in tree.leaves_below("r")] == ["a1", "a2", "b"]
    assert [n.node_id for n in tree.leaves_below("b")] == ["b"]


def test_writer_is_atomic_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [Message(role="user", content="kept")])

    def boom():
        yield Message(role="user", content="x")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_jsonl(path, boom())
    assert read_jsonl(path, Message) == [Message(role="user", content="kept")]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_append_and_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    append_jsonl(path, Message(role="user", content="one"))
    append_jsonl(path, Message(role="user", content="two"))
    with open(path, "ab") as fh:
        fh.write(b'{"role": "user", "cont')  # a writer killed mid-line
    assert [m.content for m in read_jsonl(path, Message, tolerate_torn_tail=True)] == ["one", "two"]
    with pytest.raises(RecordError, match=":3: invalid JSON"):
        read_jsonl(path, Message)
