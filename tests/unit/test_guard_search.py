"""DeferAndFuse's compile-cost guard looks for an unrolled loop's repeated block with
prefix counts (eager/defer.py `_repeated_block`); checked here against the definition
written out plainly, over sequences that repeat, almost repeat and do not."""
import random

from torch_tpu.eager import defer


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
        apart = [0]
        for o in seq:
            apart.append(apart[-1] + flag[o])
        for end in range(1, len(seq) + 1):
            ids, flags = seq[:end], [flag[o] for o in seq[:end]]
            assert defer._repeated_block(ids, apart[:end + 1]) == _reference(ids, flags), (ids, flags)


def test_long_pointwise_chain_has_no_block():
    # a chain of pointwise ops only (what `bench modes` times recording on): nothing to find
    ids = [0, 1, 2, 3] * 500
    assert defer._repeated_block(ids, [0] * (len(ids) + 1)) == (0, 0)
