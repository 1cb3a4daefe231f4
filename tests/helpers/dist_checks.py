"""The checks the collectives job runs on every rank (see tests/distributed/test_distributed.py): each
collective against the value computed on CPU from every rank's (deterministic) input.
`run_checks` returns name -> "ok" or the error.
"""
from __future__ import annotations

import os
import time
import traceback

OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]


def _inputs(torch, rank, dtype, shape=(3, 4)):
    """Small integers: exact in bfloat16 for every op, sums and products included."""
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.int64).remainder(3) + 1  # 1..3
    return (base + rank).reshape(shape).to(dtype)


def _reduce(torch, xs, op):
    st = torch.stack([x.to(torch.float64) for x in xs])
    if op == "SUM":
        r = st.sum(0)
    elif op == "AVG":
        r = st.sum(0) / len(xs)
        if not xs[0].dtype.is_floating_point:
            r = torch.trunc(r)
    elif op == "MIN":
        r = st.min(0).values
    elif op == "MAX":
        r = st.max(0).values
    elif op == "PRODUCT":
        r = st.prod(0)
    return r.to(xs[0].dtype)


def _eq(torch, got, want, what=""):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what} got {got.dtype} {tuple(got.shape)} {got.flatten()[:12].tolist()}, "
                             f"want {want.dtype} {tuple(want.shape)} {want.flatten()[:12].tolist()}")


def run_checks(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    results = {}
    seconds = results["_seconds"] = {}
    tpu = torch.device("tpu")
    red = {op: getattr(dist.ReduceOp, op) for op in OPS + ["BAND", "BOR", "BXOR"]}

    def check(name, fn):
        t0 = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except Exception:  # noqa: BLE001
            results[name] = traceback.format_exc()[-1500:]
        seconds[name] = round(time.perf_counter() - t0, 3)

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
    only = os.environ.get("TPU_DIST_CHECK_DTYPES")
    if only:
        dtypes = {k: v for k, v in dtypes.items() if k in only.split(",")}
    for dname, dt in dtypes.items():
        xs = [_inputs(torch, r, dt) for r in range(world)]
        mine = xs[rank]

        for op in OPS:
            def all_reduce(op=op):
                t = mine.to(tpu)
                dist.all_reduce(t, op=red[op])
                _eq(torch, t, _reduce(torch, xs, op))
            check(f"all_reduce[{op}-{dname}]", all_reduce)

        def broadcast():
            t = mine.to(tpu)
            dist.broadcast(t, src=world - 1)
            _eq(torch, t, xs[world - 1])
        check(f"broadcast[{dname}]", broadcast)

        def all_gather():
            outs = [torch.empty_like(mine, device=tpu) for _ in range(world)]
            dist.all_gather(outs, mine.to(tpu))
            for r in range(world):
                _eq(torch, outs[r], xs[r], f"block {r}")
        check(f"all_gather[{dname}]", all_gather)

        def all_gather_into_tensor():
            out = torch.empty((world * 3, 4), dtype=dt, device=tpu)
            dist.all_gather_into_tensor(out, mine.to(tpu))
            _eq(torch, out, torch.cat(xs))
        check(f"all_gather_into_tensor[{dname}]", all_gather_into_tensor)

        big = [torch.cat([_inputs(torch, r + 10 * j, dt) for j in range(world)]) for r in range(world)]

        def reduce_scatter():
            out = torch.empty((3, 4), dtype=dt, device=tpu)
            dist.reduce_scatter(out, [c.to(tpu) for c in big[rank].chunk(world)])
            _eq(torch, out, _reduce(torch, [b.chunk(world)[rank] for b in big], "SUM"))
        check(f"reduce_scatter[{dname}]", reduce_scatter)

        for op in ("SUM", "AVG", "MIN"):
            def rs_tensor(op=op):
                out = torch.empty((3, 4), dtype=dt, device=tpu)
                dist.reduce_scatter_tensor(out, big[rank].to(tpu), op=red[op])
                _eq(torch, out, _reduce(torch, [b.chunk(world)[rank] for b in big], op))
            check(f"reduce_scatter_tensor[{op}-{dname}]", rs_tensor)

        for op in ("SUM", "MAX"):
            def reduce(op=op):
                t = mine.to(tpu)
                dist.reduce(t, dst=1, op=red[op])
                if rank == 1:
                    _eq(torch, t, _reduce(torch, xs, op))
            check(f"reduce[{op}-{dname}]", reduce)

        if dt.is_floating_point:
            # PREMUL_SUM (NCCL's; FSDP2 reduce-scatters with it after
            # set_gradient_divide_factor): the SUM of the inputs times a factor, a number or
            # a tensor; inputs that are not outputs stay as they are
            for fname, factor in (("number", 0.5), ("tensor", torch.tensor(0.5, device=tpu))):
                premul = dist._make_nccl_premul_sum(factor)

                def premul_all_reduce(premul=premul):
                    t = mine.to(tpu)
                    dist.all_reduce(t, op=premul)
                    _eq(torch, t, (_reduce(torch, xs, "SUM").double() * 0.5).to(dt))
                check(f"all_reduce[PREMUL_SUM-{fname}-{dname}]", premul_all_reduce)

                def premul_rs_tensor(premul=premul):
                    inp = big[rank].to(tpu)
                    out = torch.empty((3, 4), dtype=dt, device=tpu)
                    dist.reduce_scatter_tensor(out, inp, op=premul)
                    want = _reduce(torch, [b.chunk(world)[rank] for b in big], "SUM")
                    _eq(torch, out, (want.double() * 0.5).to(dt))
                    _eq(torch, inp, big[rank], "the input")
                check(f"reduce_scatter_tensor[PREMUL_SUM-{fname}-{dname}]", premul_rs_tensor)

                def premul_reduce(premul=premul):
                    t = mine.to(tpu)
                    dist.reduce(t, dst=1, op=premul)
                    want = (_reduce(torch, xs, "SUM").double() * 0.5).to(dt) if rank == 1 else mine
                    _eq(torch, t, want)
                check(f"reduce[PREMUL_SUM-{fname}-{dname}]", premul_reduce)

        def all_to_all():
            ins = [big[rank].chunk(world)[j].to(tpu) for j in range(world)]
            outs = [torch.empty((3, 4), dtype=dt, device=tpu) for _ in range(world)]
            dist.all_to_all(outs, ins)
            for j in range(world):
                _eq(torch, outs[j], big[j].chunk(world)[rank], f"from {j}")
        check(f"all_to_all[{dname}]", all_to_all)

        def all_to_all_single():
            out = torch.empty_like(big[rank], device=tpu)
            dist.all_to_all_single(out, big[rank].to(tpu))
            _eq(torch, out, torch.cat([big[j].chunk(world)[rank] for j in range(world)]))
        check(f"all_to_all_single[{dname}]", all_to_all_single)

        def all_to_all_single_uneven():
            # rank r sends (r + j + 1) rows to rank j
            sizes = [[r + j + 1 for j in range(world)] for r in range(world)]
            data = [torch.arange(sum(sizes[r]) * 2, dtype=torch.int64).reshape(-1, 2).to(dt) + 100 * r
                    for r in range(world)]
            out_sizes = [sizes[j][rank] for j in range(world)]
            out = torch.empty((sum(out_sizes), 2), dtype=dt, device=tpu)
            dist.all_to_all_single(out, data[rank].to(tpu), out_sizes, sizes[rank])
            want = torch.cat([data[j].split(sizes[j])[rank] for j in range(world)])
            _eq(torch, out, want)
        check(f"all_to_all_single_uneven[{dname}]", all_to_all_single_uneven)

        def gather():
            outs = [torch.empty_like(mine, device=tpu) for _ in range(world)] if rank == 0 else None
            dist.gather(mine.to(tpu), outs, dst=0)
            if rank == 0:
                for r in range(world):
                    _eq(torch, outs[r], xs[r], f"block {r}")
        check(f"gather[{dname}]", gather)

        def scatter():
            out = torch.empty_like(mine, device=tpu)
            src = world - 1
            lst = [c.to(tpu) for c in big[src].chunk(world)] if rank == src else None
            dist.scatter(out, lst, src=src)
            _eq(torch, out, big[src].chunk(world)[rank])
        check(f"scatter[{dname}]", scatter)

        def send_recv():
            # pairs (0,1), (2,3): even ranks send, odd ranks receive, then back
            peer = rank ^ 1
            if rank % 2 == 0:
                dist.send(mine.to(tpu), dst=peer)
                back = torch.empty_like(mine, device=tpu)
                dist.recv(back, src=peer)
                _eq(torch, back, xs[peer])
            else:
                got = torch.empty_like(mine, device=tpu)
                dist.recv(got, src=peer)
                _eq(torch, got, xs[peer])
                dist.send(mine.to(tpu), dst=peer)
        check(f"send_recv[{dname}]", send_recv)

        def batch_isend_irecv():
            # a ring: send to the next rank, receive from the previous one
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            got = torch.empty_like(mine, device=tpu)
            ops = [dist.P2POp(dist.isend, mine.to(tpu), nxt), dist.P2POp(dist.irecv, got, prv)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            _eq(torch, got, xs[prv])
        check(f"batch_isend_irecv[{dname}]", batch_isend_irecv)

        def async_all_reduce():
            t = mine.to(tpu)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            _eq(torch, t, _reduce(torch, xs, "SUM"))
            fut = dist.all_reduce(mine.to(tpu), async_op=True).get_future()
            _eq(torch, fut.wait()[0], _reduce(torch, xs, "SUM"), "future")
        check(f"async_all_reduce[{dname}]", async_all_reduce)

        def async_all_gather():
            out = torch.empty((world * 3, 4), dtype=dt, device=tpu)
            work = dist.all_gather_into_tensor(out, mine.to(tpu), async_op=True)
            work.wait()
            _eq(torch, out, torch.cat(xs))
        check(f"async_all_gather[{dname}]", async_all_gather)

        # sub-groups: every rank must create every group, in the same order
        halves = [list(range(0, world, 2)), list(range(1, world, 2))]
        groups = [dist.new_group(h) for h in halves]
        pair = dist.new_group([0, 1])
        mine_half = halves[rank % 2]
        g = groups[rank % 2]

        def subgroup_all_reduce():
            t = mine.to(tpu)
            dist.all_reduce(t, group=g)
            _eq(torch, t, _reduce(torch, [xs[r] for r in mine_half], "SUM"))
            if rank in (0, 1):
                u = mine.to(tpu)
                dist.all_reduce(u, op=dist.ReduceOp.MAX, group=pair)
                _eq(torch, u, _reduce(torch, [xs[0], xs[1]], "MAX"))
        check(f"subgroup_all_reduce[{dname}]", subgroup_all_reduce)

        def subgroup_all_gather():
            outs = [torch.empty_like(mine, device=tpu) for _ in mine_half]
            dist.all_gather(outs, mine.to(tpu), group=g)
            for t, r in zip(outs, mine_half):
                _eq(torch, t, xs[r])
            t = mine.to(tpu)
            dist.broadcast(t, group_src=len(mine_half) - 1, group=g)
            _eq(torch, t, xs[mine_half[-1]])
        check(f"subgroup_all_gather[{dname}]", subgroup_all_gather)

        def functional():
            wg = dist.group.WORLD
            got = fc.all_reduce(mine.to(tpu), "sum", wg)
            _eq(torch, fc.wait_tensor(got), _reduce(torch, xs, "SUM"), "all_reduce")
            got = fc.all_gather_tensor(mine.to(tpu), 0, wg)
            _eq(torch, fc.wait_tensor(got), torch.cat(xs), "all_gather")
            got = fc.reduce_scatter_tensor(big[rank].to(tpu), "sum", 0, wg)
            _eq(torch, fc.wait_tensor(got), _reduce(torch, [b.chunk(world)[rank] for b in big], "SUM"),
                "reduce_scatter")
            got = fc.all_to_all_single(big[rank].to(tpu), None, None, wg)
            _eq(torch, fc.wait_tensor(got),
                torch.cat([big[j].chunk(world)[rank] for j in range(world)]), "all_to_all")
            got = fc.broadcast(mine.to(tpu), 0, wg)
            _eq(torch, fc.wait_tensor(got), xs[0], "broadcast")
            got = torch.ops._c10d_functional.all_reduce(mine.to(tpu), "max", wg.group_name)
            _eq(torch, torch.ops._c10d_functional.wait_tensor(got), _reduce(torch, xs, "MAX"), "op")
        check(f"functional[{dname}]", functional)

    xs64 = [_inputs(torch, r, torch.int64) * 5 for r in range(world)]
    for op in ("BAND", "BOR", "BXOR") if "int64" in dtypes else ():
        def bitwise(op=op):
            t = xs64[rank].to(tpu)
            dist.all_reduce(t, op=red[op])
            st = xs64[0].clone()
            for x in xs64[1:]:
                st = {"BAND": st & x, "BOR": st | x, "BXOR": st ^ x}[op]
            _eq(torch, t, st)
        check(f"all_reduce[{op}-int64]", bitwise)

    def view():
        base = torch.zeros(6, 8, device=tpu)
        v = base[1:5, ::2]  # a strided view: read and written through the storage
        v.copy_(_inputs(torch, rank, torch.float32, (4, 4)).to(tpu))
        dist.all_reduce(v)
        want = _reduce(torch, [_inputs(torch, r, torch.float32, (4, 4)) for r in range(world)], "SUM")
        _eq(torch, v, want)
        _eq(torch, base[0], torch.zeros(8), "untouched row")
        _eq(torch, base[1:5, 1::2], torch.zeros(4, 4), "untouched columns")
    check("all_reduce[view]", view)

    def bool_max():
        t = torch.tensor([rank == 0, False, True], device=tpu)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        _eq(torch, t, torch.tensor([True, False, True]))
    check("all_reduce[bool-MAX]", bool_max)

    def cpu_tensor():
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t)
        _eq(torch, t, torch.full((5,), float(sum(range(1, world + 1)))))
    check("cpu_tensor", cpu_tensor)

    def objects():
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
        assert objs == [{"rank": r, "name": f"r{r}"} for r in range(world)], objs
        lst = [f"hello from {rank}", rank]
        dist.broadcast_object_list(lst, src=1)
        assert lst == ["hello from 1", 1], lst
    check("objects", objects)

    def barrier():
        dist.barrier()  # (monitored_barrier is gloo-only in torch: not checked)
    check("barrier", barrier)

    def all_to_all_uneven_list():
        sizes = [[(r * 7 + j * 3) % 4 + 1 for j in range(world)] for r in range(world)]
        ins = [torch.full((sizes[rank][j],), 10.0 * rank + j, device=tpu) for j in range(world)]
        outs = [torch.empty(sizes[j][rank], device=tpu) for j in range(world)]
        dist.all_to_all(outs, ins)
        for j in range(world):
            _eq(torch, outs[j], torch.full((sizes[j][rank],), 10.0 * j + rank), f"from {j}")
    check("all_to_all_uneven_list", all_to_all_uneven_list)

    def dtensor_redistribute():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("tpu", (world,))
        full = torch.arange(world * 8 * 3, dtype=torch.float32).reshape(world * 8, 3)
        d = distribute_tensor(full.to(tpu), mesh, [Shard(0)])
        _eq(torch, d.to_local(), full.chunk(world)[rank], "shard")
        _eq(torch, d.redistribute(mesh, [Replicate()]).to_local(), full, "replicate")
        _eq(torch, d.full_tensor(), full, "full_tensor")
        s1 = d.redistribute(mesh, [Shard(1)]) if 3 % world == 0 else None
        del s1
        total = (d * 2).sum()
        _eq(torch, total.full_tensor(), (full * 2).sum(), "sum")
    check("dtensor_redistribute", dtensor_redistribute)

    def groups_and_p2p_interleaved():
        # The world group, another group over the same processes and point-to-point
        # traffic, interleaved: XLA:CPU shares one gloo communicator between programs over
        # the same processes, so they must run in one order on every rank (this used to
        # pair the wrong messages within a few hundred iterations).
        same = dist.new_group(list(range(world)))
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for i in range(60):
            a = torch.full((12,), float(rank + i), device=tpu)
            dist.all_reduce(a)
            outs = [torch.empty(4, device=tpu) for _ in range(world)]
            dist.all_gather(outs, torch.full((4,), float(rank), device=tpu), group=same)
            b = torch.ones(16, device=tpu)
            dist.all_reduce(b, group=same)
            got = torch.empty(12, device=tpu)
            dist.send(a + rank, dst=nxt)  # every rank sends first: sends never block
            dist.recv(got, src=prv)
            if i % 20 == 0 or i == 59:
                total = float(sum(range(world)) + world * i)
                _eq(torch, a, torch.full((12,), total), f"world all_reduce, step {i}")
                for r in range(world):
                    _eq(torch, outs[r], torch.full((4,), float(r)), f"all_gather, step {i}")
                _eq(torch, b, torch.full((16,), float(world)), f"group all_reduce, step {i}")
                _eq(torch, got, torch.full((12,), total + prv), f"recv, step {i}")
    check("groups_and_p2p_interleaved", groups_and_p2p_interleaved)

    def recv_wrong_size():
        # a receive that does not match its send is a clear error, and the pair still
        # works afterwards
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        dist.send(torch.arange(4.0, device=tpu), dst=nxt)
        try:
            dist.recv(torch.empty(6, device=tpu), src=prv)
        except ValueError as e:
            assert "expected 6 element(s) of torch.float32" in str(e), e
            assert "sent 4 element(s) of torch.float32" in str(e), e
        else:
            raise AssertionError("a recv of the wrong size did not raise")
        dist.send(torch.arange(3, device=tpu), dst=nxt, tag=7)
        got = torch.empty(3, dtype=torch.int64, device=tpu)
        dist.recv(got, src=prv, tag=7)
        _eq(torch, got, torch.arange(3), "after the error")
    check("recv_wrong_size", recv_wrong_size)
    return results
