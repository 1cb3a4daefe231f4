"""DeferAndFuse's compile-cost guard looks for an unrolled loop's repeated block with
prefix counts, in the loop detector that recording pushes every node into (csrc/loop.cpp
`repeated_block`, eager/defer.py); checked here against the definition written out
plainly, over sequences that repeat, almost repeat and do not."""
import random

from torch_tpu import _C
from torch_tpu.eager import defer


def _search(ids, flags):
    """The detector's answer after pushing `ids` (with their compile-apart flags)."""
    loop = _C.LoopDetector(defer.MIN_PERIOD, 1 << 30)
    for h, f in zip(ids, flags):
        loop.push(h, False, f)
    return loop.repeated_block(defer.GUARD_REPEATS, defer.GUARD_MAX_BLOCK)


def _reference(ids, apart_flags):
    """The newest nodes: the shortest block repeated GUARD_REPEATS times in a row that holds
    an op compiling apart -> (P, 0); else the shortest such block seen twice -> (0, nodes
    until its repeats); else (0, 0)."""
    r, n = defer.GUARD_REPEATS, len(ids)
    window = min(n, r * defer.GUARD_MAX_BLOCK)
    for p in range(1, min(window // 2, defer.GUARD_MAX_BLOCK) + 1):
        block = ids[n - p:]
        if ids[n - 2 * p:n - p] != block or not any(apart_flags[n - p:]):
            continue
        k = 2
        while k < r and (k + 1) * p <= window and ids[n - (k + 1) * p:n - k * p] == block:
            k += 1
        return (p, 0) if k >= r else (0, (r - k) * p)
    return 0, 0


def _sequence(rng):
    ops = rng.randint(2, 6)
    block = [rng.randrange(ops) for _ in range(rng.randint(1, 12))]
    seq = [rng.randrange(ops) for _ in range(rng.randint(0, 20))]
    seq += block * rng.randint(1, 8)
    if rng.random() < 0.3:
        seq[rng.randrange(len(seq))] = ops  # a stray op somewhere
    return seq, {o: rng.random() < 0.4 for o in range(ops + 1)}


def test_block_search_matches_its_definition():
    rng = random.Random(0)
    for _ in range(400):
        seq, flag = _sequence(rng)
        loop = _C.LoopDetector(defer.MIN_PERIOD, 1 << 30)
        for end, o in enumerate(seq, 1):
            loop.push(o, False, flag[o])  # (searched after every push, as checkpoints do)
            ids, flags = seq[:end], [flag[o] for o in seq[:end]]
            got = loop.repeated_block(defer.GUARD_REPEATS, defer.GUARD_MAX_BLOCK)
            assert got == _reference(ids, flags), (ids, flags)
        loop.reset()
        assert loop.repeated_block(defer.GUARD_REPEATS, defer.GUARD_MAX_BLOCK) == (0, 0)


def test_long_blocks_and_windows_match_their_definition():
    # blocks near GUARD_MAX_BLOCK, and histories longer than the searched window
    rng = random.Random(1)
    for _ in range(12):
        p = rng.randint(defer.GUARD_MAX_BLOCK - 20, defer.GUARD_MAX_BLOCK + 4)
        block = [rng.randrange(1 << 40) for _ in range(p)]
        seq = [rng.randrange(1 << 40) for _ in range(rng.randint(0, 300))]
        seq += block * rng.randint(1, defer.GUARD_REPEATS + 1)
        flags = [rng.random() < 0.05 for _ in seq]
        assert _search(seq, flags) == _reference(seq, flags)


def test_long_pointwise_chain_has_no_block():
    # a chain of pointwise ops only (what `bench modes` times recording on): nothing to find
    ids = [0, 1, 2, 3] * 500
    assert _search(ids, [False] * len(ids)) == (0, 0)
