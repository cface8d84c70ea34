"""The suffix index over history (mlxspec/drafters/history/, issue 32): its longest match
against a brute-force search, the counts and probabilities of its tries, the budget set by
the match length, eviction, memory, namespaces, files on disk and their damage, determinism.
Plain Python and numpy: no model, no MLX."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxspec.drafters.history import (
    FORMAT,
    HistoryDrafter,
    HistoryIndex,
    HistoryStore,
    Speculation,
    footprint,
    namespace_of,
    read_documents,
)
from mlxspec.drafters.history.files import within
from mlxspec.errors import DamagedHistory

EVERYTHING = Speculation(factor=1000, min_prob=0.0)  # no budget or probability cut: the whole trie
EXACT = {"limit_tokens": None, "max_occurrences": 100_000}  # no occurrence left unread


def index_of(documents, **shape) -> HistoryIndex:
    index = HistoryIndex(**{**EXACT, **shape})
    for document in documents:
        index.add(document)
    return index


def brute_matches(documents, context, *, max_match: int) -> tuple[int, list[tuple[int, ...]]]:
    """The longest suffix of the context that occurred with an id after it, by trying every
    place of every document, and what followed each of its occurrences."""
    context = context[-max_match:]
    found = []
    for document in documents:
        for end in range(len(document) - 1):
            length = 0
            while length < len(context) and length <= end and document[end - length] == context[-1 - length]:
                length += 1
            found.append((length, tuple(document[end + 1 :])))
    longest = max((length for length, _ in found), default=0)
    return longest, [after for length, after in found if length == longest]


def node_paths(tree) -> list[tuple[int, ...]]:
    return [tuple(tree.path_ids(tree.ancestors(node))) for node in range(1, len(tree) + 1)]


documents_strategy = st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=8)


# --- the longest match and its counts ---------------------------------------------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=documents_strategy, context=st.lists(st.integers(0, 3), max_size=40), max_match=st.integers(2, 16))
def test_longest_match_is_the_brute_force_one(documents, context, max_match):
    index = index_of(documents, max_match=max_match)
    longest, continuations = brute_matches(documents, context, max_match=max_match)
    found = index.match(context)
    if longest < index.min_match:
        assert found is None
        return
    assert found is not None and int(found.lengths.max()) == longest
    at_longest = found.positions[found.lengths == longest]
    read = index._continuations(at_longest, 64)
    assert Counter(read) == Counter(continuations)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=documents_strategy, context=st.lists(st.integers(0, 3), min_size=2, max_size=20))
def test_trie_counts_are_the_continuations_counts(documents, context):
    """Every node: the share of the occurrences (of the chosen match length) whose
    continuation starts with its path, over its parent path's share."""
    index = index_of(documents)
    proposal = index.propose(context, max_nodes=10_000, speculation=EVERYTHING)
    if proposal is None:
        return
    occurrences = [
        after
        for document in documents
        for end in range(len(document) - 1)
        if tuple(document[end - proposal.match_length + 1 : end + 1]) == tuple(context[-proposal.match_length :])
        and end - proposal.match_length + 1 >= 0
        for after in [tuple(document[end + 1 :])]
    ]
    assert proposal.occurrences == len(occurrences)
    paths = node_paths(proposal.tree)
    every_prefix = {after[:k] for after in occurrences for k in range(1, len(after) + 1)}
    assert set(paths) == every_prefix and len(paths) == len(every_prefix)  # the whole trie, once each

    def share(path):
        return sum(after[: len(path)] == path for after in occurrences)

    for path, prob, reach in zip(paths, proposal.probs, proposal.reach):
        assert prob == pytest.approx(share(path) / share(path[:-1]))
        assert reach == pytest.approx(share(path) / len(occurrences))
    assert list(proposal.reach) == sorted(proposal.reach, reverse=True)  # best first


def test_probabilities_by_hand():
    index = index_of([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4], [9, 2, 3, 4]])
    longest = index.propose([7, 1, 2, 3], max_nodes=8, speculation=Speculation(min_prob=0))
    assert longest.match_length == 3 and longest.occurrences == 3
    assert longest.tree.ids == (4, 5) and longest.tree.parents == (0, 0)
    assert longest.probs == pytest.approx((2 / 3, 1 / 3))
    shorter = index.propose([2, 3], max_nodes=8, speculation=Speculation(min_prob=0))
    assert shorter.match_length == 2 and shorter.probs == pytest.approx((3 / 4, 1 / 4))


def test_best_first_order_and_sibling_ties():
    """Equal path probabilities: the one offered first is taken first (the root's second child
    before the grandchildren under its first); equal counts among siblings: the newest first."""
    index = index_of([[5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 1, 2]])
    two = index.propose([5, 6], max_nodes=8, speculation=Speculation(min_prob=0))
    assert two.tree.ids == (7, 1) and two.tree.parents == (0, 0)
    six = index.propose([5, 6], max_nodes=8, speculation=Speculation(factor=3, min_prob=0))
    assert six.tree.ids == (7, 1, 9, 8, 2) and six.tree.parents == (0, 0, 1, 1, 2)
    assert six.probs == pytest.approx((2 / 3, 1 / 3, 1 / 2, 1 / 2, 1))
    assert six.score == pytest.approx(2 / 3 + 4 * 1 / 3)


def test_one_continuation_is_a_chain_and_chain_mode_follows_the_most_frequent():
    index = index_of([[1, 2, 3, 4, 5, 6, 7]])
    alone = index.propose([0, 1, 2, 3], max_nodes=8)
    assert alone.tree.is_chain and alone.tree.ids == (4, 5, 6)
    branching = index_of([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 8, 9]])
    tree = branching.propose([1, 2], max_nodes=8, speculation=Speculation(factor=4, min_prob=0))
    assert not tree.tree.is_chain
    chain = branching.propose([1, 2], max_nodes=8, speculation=Speculation(factor=4, min_prob=0), chain=True)
    assert chain.tree.is_chain and chain.tree.ids == (3, 4)


def test_min_prob_cuts_rare_continuations():
    index = index_of([[1, 2, 3, x] for x in range(10, 20)])
    assert len(index.propose([1, 2, 3], max_nodes=16, speculation=Speculation(min_prob=0.1)).tree) == 3
    assert index.propose([1, 2, 3], max_nodes=16, speculation=Speculation(min_prob=0.2)) is None


def test_the_context_itself_is_no_occurrence():
    """The local index holds the context: its own end has nothing after it."""
    index = index_of([[1, 2, 3, 4]])
    assert index.propose([1, 2, 3, 4], max_nodes=8) is None


def test_no_match_crosses_a_document_border():
    index = index_of([[1, 2], [3, 4]])
    assert index.propose([2, 3], max_nodes=8) is None  # [2, 3] never occurred inside one document
    assert index.propose([9, 3], max_nodes=8) is None  # a match of 1 is below min_match
    assert index_of([[1, 2], [3, 4]], min_match=1).propose([9, 3], max_nodes=8).tree.ids == (4,)


# --- the budget: SuffixDecoding's MAX_SPEC ----------------------------------------------
@pytest.mark.parametrize(
    ("context_length", "factor", "offset", "max_nodes", "nodes"),
    [(2, 1.0, 0.0, 64, 2), (8, 1.0, 0.0, 64, 8), (8, 2.0, 0.0, 64, 16), (8, 2.0, 0.0, 5, 5), (8, 1.0, -3.0, 64, 5)],
)
def test_budget_is_factor_times_match_length(context_length, factor, offset, max_nodes, nodes):
    index = index_of([list(range(100))])
    context = list(range(40 - context_length, 40))
    proposal = index.propose(context, max_nodes=max_nodes, speculation=Speculation(factor=factor, offset=offset))
    assert proposal.match_length == context_length
    assert proposal.tree.ids == tuple(range(40, 40 + nodes))


def test_match_length_is_at_most_max_match():
    index = index_of([list(range(100))], max_match=8)
    proposal = index.propose(list(range(40)), max_nodes=64)
    assert proposal.match_length == 8 and len(proposal.tree) == 8


# --- adding: whole or id by id ----------------------------------------------------------
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=documents_strategy, pieces=st.lists(st.integers(1, 40), min_size=1, max_size=10))
def test_extending_id_by_id_builds_the_same_index(documents, pieces):
    """The few-ids path (plain Python) and the numpy path hash and link alike."""
    whole = index_of(documents)
    grown = HistoryIndex(**EXACT)
    for document in documents:
        grown.add([])
        at, sizes = 0, iter(pieces * 100)
        while at < len(document):
            size = next(sizes)
            grown.extend(document[at : at + size])
            at += size
    for mine, theirs in ((whole._tokens, grown._tokens), (whole._back, grown._back), (whole._heads, grown._heads)):
        assert np.array_equal(mine, theirs)
    assert whole.kept() == grown.kept() == [list(d) for d in documents]


# --- eviction and memory ----------------------------------------------------------------
def test_oldest_documents_are_forgotten_first_and_whole():
    index = HistoryIndex(limit_tokens=64)
    first, second, third = (list(range(k * 100, k * 100 + 20)) for k in range(1, 4))
    for document in (first, second, third):
        index.add(document)
    assert index.documents == 3 and index.size == 63
    index.add(list(range(400, 420)))
    assert index.kept() == [second, third, list(range(400, 420))]
    assert index.propose(first[:5], max_nodes=8) is None
    assert index.propose(second[:5], max_nodes=8).tree.ids[0] == second[5]
    index.add(list(range(1000, 1200)))  # alone longer than the limit: its last ids only
    assert index.documents == 1 and index.kept() == [list(range(1200 - 64, 1200))]
    assert index.propose([1150, 1151], max_nodes=4).tree.ids == (1152, 1153)
    assert index.propose([1000, 1001], max_nodes=4) is None


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    documents=st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=30),
    context=st.lists(st.integers(0, 3), min_size=2, max_size=12),
    limit=st.integers(8, 200),
)
def test_a_bounded_index_is_an_exact_index_of_what_it_keeps(documents, context, limit):
    """After evictions, proposals are those of an index built from the kept documents alone."""
    bounded = HistoryIndex(limit_tokens=limit, max_occurrences=100_000)
    for document in documents:
        bounded.add(document)
        assert bounded.size <= limit
    rebuilt = index_of(bounded.kept())
    assert bounded.propose(context, max_nodes=16) == rebuilt.propose(context, max_nodes=16)


def test_memory_stays_flat_over_thousands_of_documents():
    """3000 documents through a 4096-token index, one in ten through a whole request (its own
    index, proposals, the answer added at the end): what tracemalloc sees stays flat."""
    limit = 4096
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        index = HistoryIndex(limit_tokens=limit)
        drafter = HistoryDrafter(index)
        for document in range(3000):
            prompt, answer = (rng.integers(0, 500, rng.integers(1, 60)).tolist() for _ in range(2))
            if document % 10:
                index.add(prompt + answer)
            else:
                with drafter.begin(prompt):
                    drafter.hear(answer)
                    drafter.query(8)
            assert index.size <= limit
            if document == 500:
                warm, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.nbytes == footprint(limit)
    assert current - warm < 64 * 1024  # flat: what grows is bounded by the limit, not the stream
    assert peak < warm + footprint(limit)  # a request's temporaries stay small beside the index


def test_a_store_holds_at_most_max_namespaces():
    store = HistoryStore(limit_tokens=256, max_namespaces=3)
    for k in range(10):
        store.index(f"n{k}").add([k, k + 1])
    assert len(store._indexes) == 3 and set(store._indexes) == {"n7", "n8", "n9"}


# --- requests and namespaces ------------------------------------------------------------
PROMPT = list(range(1000, 1040))  # ids that repeat nowhere: the local index alone proposes nothing
SECRET = list(range(2000, 2030))


def answered(drafter: HistoryDrafter, prompt, answer) -> None:
    with drafter.begin(prompt):
        drafter.hear(answer)


def test_a_later_request_drafts_from_an_earlier_answer():
    store = HistoryStore(limit_tokens=10_000)
    answered(store.drafter("team"), PROMPT, SECRET)
    drafter = store.drafter("team").begin(PROMPT)
    found = drafter.query(8)
    assert found.source == "history" and found.tree.ids == tuple(SECRET[:8])
    assert drafter.chain(4) == tuple(SECRET[:4])
    drafter.hear(SECRET[:10])  # on its way, the same answer again: still proposed from history
    assert drafter.chain(4) == tuple(SECRET[10:14])
    drafter.end()  # the prompt was in the history already: its last max_match ids come before the answer
    assert store.index("team").kept() == [PROMPT + SECRET, PROMPT[-32:] + SECRET[:10]]


def test_a_resent_conversation_adds_only_its_new_turns():
    """An agent's loop: each prompt is the last prompt, its answer and a tool's result. The
    history grows by the new parts only, and still drafts across each border."""
    index = HistoryIndex(limit_tokens=100_000)
    system, result = list(range(3000, 3100)), list(range(4000, 4020))
    call = [7, 8, 9, 10, 11, 12]
    prompt = system
    for turn in range(5):
        drafter = HistoryDrafter(index).begin(prompt)
        if turn >= 2:
            assert drafter.chain(6) == tuple(call)  # after "result, header": the call, from history
        answered_ids = [*call, 100 + turn]
        drafter.hear(answered_ids)
        drafter.end()
        prompt = prompt + answered_ids + result + [5]  # a tool result, then the assistant's header (5)
    assert index.documents == 5  # markers, the system prompt once, answers, and what came before each answer:
    assert index.size == 5 + len(system) + 5 * 7 + 4 * (32 + 21)  # a result and a header after 32 ids it resent
    assert index.kept()[2] == (prompt[: len(system) + 2 * 28])[-(32 + 21) :] + [*call, 102]


def test_one_namespace_never_drafts_from_another():
    store = HistoryStore(limit_tokens=10_000)
    alice, bob = store.namespace_of("sk-alice"), store.namespace_of("sk-bob")
    assert alice != bob and "alice" not in alice
    answered(store.drafter(alice), PROMPT, SECRET)
    with store.drafter(bob).begin(PROMPT) as drafter:
        assert drafter.query(16) is None and drafter.chain(8) == ()
        drafter.hear(SECRET[:3])  # even once bob's answer starts like alice's
        proposal = drafter.query(16)
        assert proposal is None or not set(proposal.tree.ids) & set(SECRET[3:])
    with store.drafter(alice).begin(PROMPT) as drafter:
        assert drafter.query(16).tree.ids[:8] == tuple(SECRET[:8])


def test_the_local_index_wins_a_tie_and_the_better_score_wins():
    history = index_of([[1, 2, 3, 50, 51, 52]])
    drafter = HistoryDrafter(history).begin([1, 2, 3, 60, 61, 62, 9, 1, 2, 3])
    local = drafter.query(8)
    assert local.source == "local" and local.tree.ids == (60, 61, 62)  # both score 3
    history.add([9, 1, 2, 3, 50, 51, 52, 53, 54])
    better = drafter.query(8)
    assert better.source == "history" and better.tree.ids == (50, 51, 52, 53)  # a longer match: a budget of 4


def test_a_drafter_beside_a_model_ignores_short_matches():
    drafter = HistoryDrafter(index_of([[7, 8, 9, 10]]), min_match=3).begin([1, 7, 8])
    assert drafter.query(8) is None
    drafter.hear([9])
    assert drafter.chain(4) == (10,)


def test_keep_prompts_off_keeps_the_prompts_tail_before_the_answer():
    index = HistoryIndex(limit_tokens=10_000, max_match=8)
    answered(HistoryDrafter(index, keep_prompts=False), PROMPT, SECRET)
    assert index.kept() == [PROMPT[-8:] + SECRET]


def test_proposing_before_begin_is_a_mistake():
    with pytest.raises(RuntimeError, match="begin"):
        HistoryDrafter(HistoryIndex()).query(4)


def test_bad_ids_and_settings_are_refused():
    with pytest.raises(ValueError):
        HistoryIndex().add([1, -2])
    with pytest.raises(ValueError):
        HistoryIndex(limit_tokens=1)
    with pytest.raises(ValueError):
        HistoryIndex(min_match=4, max_match=3)
    with pytest.raises(ValueError):
        HistoryStore().index("../etc")


# --- determinism ------------------------------------------------------------------------
def test_same_history_and_context_give_the_same_tree(tmp_path):
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 6, rng.integers(5, 80)).tolist() for _ in range(60)]
    contexts = [rng.integers(0, 6, 12).tolist() for _ in range(100)]
    one, two = (index_of(documents, limit_tokens=2048, max_occurrences=32) for _ in range(2))
    one.save(tmp_path / "h.npz")
    three = HistoryIndex(limit_tokens=2048, max_occurrences=32)
    three.load(tmp_path / "h.npz")
    proposals = [one.propose(c, max_nodes=12) for c in contexts]
    assert sum(p is not None and not p.tree.is_chain for p in proposals) > 10  # trees, not only chains
    assert proposals == [two.propose(c, max_nodes=12) for c in contexts]
    assert proposals == [three.propose(c, max_nodes=12) for c in contexts]
    assert proposals == [one.propose(c, max_nodes=12) for c in contexts]


# --- on disk ----------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    index = index_of([PROMPT + SECRET, [1, 2, 3], []], limit_tokens=10_000)
    path = tmp_path / "history" / "team.npz"
    index.save(path)
    return path


def test_a_saved_index_loads_back_whole(saved):
    assert read_documents(saved) and [d.tolist() for d in read_documents(saved)] == [PROMPT + SECRET, [1, 2, 3], []]
    store = HistoryStore(limit_tokens=10_000, folder=saved.parent, warn=pytest.fail)
    with store.drafter("team").begin(PROMPT) as drafter:
        assert drafter.chain(4) == tuple(SECRET[:4])


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def garbage(data: bytes) -> bytes:
    return np.random.default_rng(0).bytes(len(data))


def empty(data: bytes) -> bytes:
    return b""


@pytest.mark.parametrize("damage", [truncate, garbage, empty])
def test_a_damaged_file_is_refused_in_one_line(saved, damage):
    saved.write_bytes(damage(saved.read_bytes()))
    with pytest.raises(DamagedHistory) as refused:
        read_documents(saved)
    line = str(refused.value)
    assert str(saved) in line and "\n" not in line


def rewrite(path, *, header=None, lengths=None, tokens=None, extra=None) -> None:
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    if header is not None:
        arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    for name, value in (("lengths", lengths), ("tokens", tokens)):
        if value is not None:
            arrays[name] = value
    arrays.update(extra or {})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def pickled(path) -> None:
    with open(path, "wb") as f:
        np.save(f, np.array([{"a": 1}], dtype=object))


def header_of(path) -> dict:
    with np.load(path) as archive:
        return json.loads(archive["header"].tobytes())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: rewrite(p, header={**header_of(p), "format": "mlxspec-history/0"}), "format"),
        (lambda p: rewrite(p, header={"format": FORMAT}), "sha256"),
        (lambda p: rewrite(p, tokens=np.arange(70, dtype="<i4")), "sha256"),  # altered, digest left as it was
        (lambda p: rewrite(p, tokens=np.arange(73, dtype="<i8")), "type"),
        (lambda p: rewrite(p, extra={"more": np.zeros(3)}), "holds"),
        (lambda p: np.savez(p, something=np.zeros(3)), "holds"),  # a foreign .npz
        (lambda p: pickled(p), "not a sound"),  # a pickle: never unpickled
    ],
    ids=["version", "no-digest", "content", "dtype", "extra-array", "foreign", "pickle"],
)
def test_a_foreign_or_altered_file_is_refused(saved, change, reason):
    change(saved)
    with pytest.raises(DamagedHistory, match=reason):
        read_documents(saved)


def test_a_resealed_file_with_bad_ids_is_refused(saved):
    """A consistent file (its digest matches) with ids no tokenizer has: still refused."""
    lengths, tokens = np.array([3], "<i8"), np.array([1, -5, 2], "<i4")
    from mlxspec.drafters.history.files import digest as _digest

    rewrite(saved, header={"format": FORMAT, "sha256": _digest(lengths, tokens)}, lengths=lengths, tokens=tokens)
    with pytest.raises(DamagedHistory, match="out of range"):
        read_documents(saved)


def test_no_flipped_byte_loads_as_if_sound(saved):
    """Every single byte flipped, one at a time: refused, or (a byte zip does not read back,
    such as a timestamp) the very same documents. Never other documents."""
    original = saved.read_bytes()
    sound = [d.tolist() for d in read_documents(saved)]
    refused = 0
    for at in range(len(original)):
        saved.write_bytes(original[:at] + bytes([original[at] ^ 0x5A]) + original[at + 1 :])
        try:
            documents = read_documents(saved)
        except DamagedHistory as e:
            assert "\n" not in str(e)
            refused += 1
            continue
        assert [d.tolist() for d in documents] == sound, f"byte {at} flipped loaded other documents"
    assert refused > len(original) * 0.8


def test_a_store_refuses_a_damaged_file_starts_empty_and_rewrites_it(saved):
    saved.write_bytes(truncate(saved.read_bytes()))
    warnings = []
    store = HistoryStore(limit_tokens=10_000, folder=saved.parent, warn=warnings.append)
    index = store.index("team")
    assert index.documents == 0 and len(warnings) == 1
    assert "not a sound history file" in warnings[0] and "starting an empty history" in warnings[0]
    answered(store.drafter("team"), PROMPT, SECRET)
    store.save()
    assert [d.tolist() for d in read_documents(saved)] == [PROMPT + SECRET]


def test_a_store_saves_a_namespace_it_drops(tmp_path):
    store = HistoryStore(limit_tokens=256, max_namespaces=1, folder=tmp_path, warn=pytest.fail)
    answered(store.drafter("a"), [1, 2, 3], [4, 5])
    store.index("b")  # "a" is dropped from memory, and written
    assert [d.tolist() for d in read_documents(tmp_path / "a.npz")] == [[1, 2, 3, 4, 5]]
    assert store.index("a").kept() == [[1, 2, 3, 4, 5]]


def test_history_imports_without_mlx():
    code = (
        "import sys, mlxspec.drafters.history; print([m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- hostile paths and names (issue 39) ---------------------------------------------------
def test_a_keys_namespace_is_a_keyed_digest_and_its_secret_is_kept(tmp_path):
    assert namespace_of("sk-alice", secret=b"a" * 32) != namespace_of("sk-alice", secret=b"b" * 32)
    plain = "key-" + hashlib.sha256(b"sk-alice").hexdigest()[:32]
    assert HistoryStore().namespace_of("sk-alice") not in (plain, HistoryStore().namespace_of("sk-alice"))
    kept = HistoryStore(folder=tmp_path / "h").namespace_of("sk-alice")
    assert kept == HistoryStore(folder=tmp_path / "h").namespace_of("sk-alice") != plain  # the same secret, read back
    assert (tmp_path / "h" / "key-secret").stat().st_mode & 0o777 == 0o600


def test_servers_starting_at_once_read_one_whole_secret(tmp_path):
    """The secret was made empty and filled after: a second server starting at that moment
    read 0 bytes and refused to start (3 in 60 in review), as would every start after a crash
    between the two. Made whole and linked in place, every reader sees all of one secret."""
    from mlxspec.drafters.history.files import folder_secret

    for attempt in range(20):
        folder, seen = tmp_path / str(attempt), []
        readers = [threading.Thread(target=lambda f=folder, s=seen: s.append(folder_secret(f))) for _ in range(4)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        assert len(seen) == 4 and len(set(seen)) == 1 and len(seen[0]) == 32
        assert sorted(p.name for p in folder.iterdir()) == ["key-secret"]  # no part left


def test_a_link_at_a_history_path_is_not_followed(tmp_path):
    """A link planted in the history folder is not read through (nor written through: each
    write is a new file of its own name, put in place)."""
    elsewhere = tmp_path / "elsewhere.npz"
    store = HistoryStore(limit_tokens=256, folder=tmp_path / "a")
    answered(store.drafter("team"), [1, 2, 3], [4, 5])
    store.save()
    (tmp_path / "a" / "team.npz").rename(elsewhere)
    (tmp_path / "a" / "team.npz").symlink_to(elsewhere)
    warnings = []
    assert HistoryStore(limit_tokens=256, folder=tmp_path / "a", warn=warnings.append).index("team").documents == 0
    assert len(warnings) == 1 and "team.npz" in warnings[0]


def test_describe_never_waits_on_the_lock_the_worker_holds():
    """/health reads describe() on the event loop: it must answer while the worker holds the
    store's lock (drafting, adding, or reading a file)."""
    store = HistoryStore(limit_tokens=256)
    store.index("team").add([1, 2, 3])
    described = []
    with store._lock:
        reader = threading.Thread(target=lambda: described.append(store.describe("team")), daemon=True)
        reader.start()
        reader.join(timeout=5)
    assert described and described[0]["documents"] == 1


@pytest.mark.alone  # timed against the wall clock: refused within 5 s, abandoned within 2 s
def test_a_fifo_is_refused_without_blocking_and_a_slow_read_is_abandoned(tmp_path):
    fifo = tmp_path / "team.npz"
    os.mkfifo(fifo)
    warnings = []
    started = time.monotonic()
    store = HistoryStore(limit_tokens=256, folder=tmp_path, warn=warnings.append)
    assert store.index("team").documents == 0 and time.monotonic() - started < 5
    assert len(warnings) == 1 and "not a regular file" in warnings[0]
    hung = threading.Event()  # a read that never returns, as on a mount that stopped answering
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer within 0.2 s"):
        within(0.2, hung.wait, what="a hung file")
    assert time.monotonic() - started < 2


def test_a_namespace_that_cannot_be_saved_leaves_the_others_saved(tmp_path):
    tmp_path.chmod(0o755)
    folder = tmp_path / "cache" / "history"
    warnings = []
    store = HistoryStore(limit_tokens=256, folder=folder, warn=warnings.append)
    for name in ("a", "b", "c"):
        answered(store.drafter(name), [1, 2, 3], [4, 5])
    folder.mkdir(parents=True)
    (folder / "a.npz").mkdir()
    store.save()
    assert [p.name for p in sorted(folder.iterdir())] == ["a.npz", "b.npz", "c.npz"]  # no .partial left
    assert len(warnings) == 1 and "a.npz: the history could not be saved" in warnings[0]
    assert (folder / "b.npz").stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    assert tmp_path.stat().st_mode & 0o777 == 0o755  # a folder above that was there already is left as it was
