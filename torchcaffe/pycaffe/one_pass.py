"""``forward_backward`` as one autograd pass over the whole net (the solver's step).

The Caffe face's general path (net.py) runs one autograd call per layer over per-layer leaf
copies of the bottoms, so partial passes and blobs a script edits between calls behave as in
Caffe. Inside ``forward_backward`` nothing can edit a blob between the two halves, so the same
values come from one graph: each layer reads its producer's top tensor (no clone), and one
``torch.autograd.grad`` call returns every bottom diff and param diff that Caffe's
layer-by-layer Backward writes. The diffs are then written in Caffe's backward order (last
layer first), so a blob two layers write ends with the value Caffe leaves in it.

Each layer's forward is recorded as on the general path (the graph is kept), so a later
``backward()`` sees the same forward state (Dropout's mask). Each (layer, bottom) edge reads
its own alias (a view) of the producer's top, so autograd returns that layer's gradient
alone, as Caffe's per-layer bottom diff. A top no later edge reads (a loss, or a top whose
readers do not backpropagate) seeds the pass with its blob's diff, as Caffe's Backward reads
it there.

Blobs take the pass's tensors (``Blob.take_data``/``take_diff``) instead of copying them
where no one holds a view of their buffers; a held numpy view keeps seeing the values. In a
solver step (``clear``) the param diffs do the same with autograd's gradients, which then
are also the params' ``.grad`` that the update reads. The old diffs the backward replaces
whole are released before autograd makes the new ones (``SyncedMemory.release``), so the
step's peak (the backward) holds one set of diffs, not two, and the gradients reuse that
memory at once. (Releasing the old data before the forward as well saves little more,
since the forward's peak is below the backward's, and the heap then churns: glibc trims
and faults back more pages.)

``plan_one_pass`` says None for a net the one pass cannot reproduce exactly, which then takes
the layer-by-layer path: a layer that needs backward but has no Backward in Caffe, a Python
layer (its code may read blobs), an in-place ReLU, BNLL, Log, Clip... whose blob a later layer
overwrites (Caffe takes its slope at the final data; see ops/neuron.py), a layer whose top a
later layer overwrites where the layer-by-layer path computes its Backward from the blobs
(``has_top_data_rule``: an LRN, an ELU, a Softmax...), a param whose diff
Caffe skips in one of its layers, or a param shared by more than two layers (autograd's sum
of three could round differently from Caffe's running sum).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..net.program import LayerStep
from ..ops.base import CaffeLayer
from ..ops.python_layer import PythonLayer
from .backward_reads import has_top_data_rule

if TYPE_CHECKING:
    from .net import Net

MAX_PARAM_USERS = 2  # a sum of two is the same in any order


@dataclass(frozen=True)
class StepRun:
    """One non-Input step of the pass, with what depends only on the net's structure (worked
    out once per plan, not per bottom and top on every pass)."""

    index: int  # in the net's steps
    step: LayerStep
    record: bool  # autograd records its forward
    edges: tuple[bool, ...]  # per bottom: does a diff flow to it (recorded, Caffe's need)?
    clones: tuple[bool, ...]  # per bottom read from its blob: a later in-place layer writes it
    loss_tops: tuple[tuple[int, float], ...]  # (top index, loss weight) of the weighted tops


@dataclass(frozen=True)
class OnePassPlan:
    """The steps whose forward autograd records, and the params whose diffs it returns."""

    recorded: frozenset[int]  # step indices with need_backward (all have a Caffe Backward)
    params: tuple[nn.Parameter, ...]  # distinct, in first-use order
    runs: tuple[StepRun, ...]  # the non-Input steps, in order


def plan_one_pass(net: Net) -> OnePassPlan | None:
    """The plan for ``net``, or None where only the layer-by-layer path is exact."""
    tnet = net.module
    recorded: set[int] = set()
    users: Counter[int] = Counter()
    params: dict[int, nn.Parameter] = {}
    for i, step in enumerate(tnet.steps):
        module = tnet.module_of(step)
        if isinstance(module, PythonLayer):
            return None
        if not step.need_backward or step.is_input:
            continue
        if isinstance(module, CaffeLayer) and not module.has_backward:
            return None
        if net._top_rewritten[i] and (
            getattr(module, "in_place_slope", False) or has_top_data_rule(step, module)
        ):  # its Caffe Backward reads the blobs' final data, which the layer-by-layer path
            return None  # computes with that Backward's own arithmetic
        if i in net._relu_masks_moved:  # its mask is a later in-place layer's output's sign
            return None
        recorded.add(i)
        for p, need in zip(module.param_blobs(), step.param_need_backward):
            if not isinstance(p, nn.Parameter) or not p.requires_grad:
                continue
            if not need:  # autograd would add this layer's share; Caffe does not
                return None
            users[id(p)] += 1
            params.setdefault(id(p), p)
    if any(n > MAX_PARAM_USERS for n in users.values()):
        return None
    if not recorded or not _top_diffs_match(tnet.steps, recorded):
        return None
    runs = tuple(
        StepRun(
            i,
            step,
            i in recorded,
            tuple(i in recorded and need for need in step.bottom_need_backward),
            tuple(net._overwritten[i]),
            tuple((k, w) for k, w in enumerate(step.loss_weights) if w),
        )
        for i, step in enumerate(tnet.steps)
        if not step.is_input
    )
    return OnePassPlan(frozenset(recorded), tuple(params.values()), runs)


def _top_diffs_match(steps: list[LayerStep], recorded: set[int]) -> bool:
    """Does every recorded top get, from autograd, the diff Caffe's Backward reads for it?

    It does when the top's value is read by at most one backpropagating bottom (Caffe would
    hand the producer the last write, autograd the sum), and, when it is read by none, no
    later layer writes that blob's diff (Caffe's producer would read that write; the pass
    seeds the blob's diff from before).
    """

    def writes_diff(k: int, j: int) -> bool:
        return k in recorded and steps[k].bottom_need_backward[j]

    last_write: dict[str, int] = {}  # blob -> the last layer whose Backward writes its diff
    for k, step in enumerate(steps):
        for j, bottom in enumerate(step.bottoms):
            if writes_diff(k, j):
                last_write[bottom] = k
    producer: dict[str, int] = {}  # blob -> the recorded layer whose top it holds now
    readers: dict[str, int] = {}  # blob -> diff-writing reads of that top so far

    def version_ok(blob: str) -> bool:  # the value ``blob`` holds is overwritten or final
        i = producer.pop(blob, None)
        if i is None:
            return True
        n = readers.pop(blob)
        return n == 1 or (n == 0 and last_write.get(blob, -1) <= i)

    for k, step in enumerate(steps):
        for j, bottom in enumerate(step.bottoms):
            if bottom in producer and writes_diff(k, j):
                readers[bottom] += 1
        for top in step.tops:
            if not version_ok(top):
                return False
            if k in recorded:
                producer[top], readers[top] = k, 0
    return all(version_ok(blob) for blob in list(producer))


def forward_backward_one_pass(net: Net, plan: OnePassPlan, clear: bool = False) -> float:
    """Caffe's ForwardBackward over the whole net in one autograd pass; returns the loss.

    ``clear``: ClearParamDiffs first, fused: each param diff is written once as ``grad +
    0`` (what zeroing then accumulating ``0 + grad`` leaves, bit for bit, -0 included), a
    param without a gradient is zeroed."""
    tnet = net.module
    device = net._ensure_device()
    net._check_input_shapes()
    net._records.clear()
    values: dict[str, torch.Tensor] = {}
    edges: list[tuple[int, int, torch.Tensor]] = []  # (step, bottom index, what it read)
    read: set[int] = set()  # ids of the tops some edge read
    produced: list[tuple[str, torch.Tensor]] = []  # recorded tops autograd can reach
    live: set[int] = set()  # recorded steps with such a top (others write no diff)
    loss = 0.0
    grad_mode = was_enabled = torch.is_grad_enabled()
    try:
        for run in plan.runs:
            step, i = run.step, run.index
            if run.record != grad_mode:  # switched only where it changes
                grad_mode = run.record
                torch.set_grad_enabled(grad_mode)
            bottoms = []
            for j, name in enumerate(step.bottoms):
                t = values.get(name)
                if t is None:  # an input blob: a later in-place layer may overwrite it
                    t = net._blob_of[name].data_at(device)
                    t = t.clone() if run.clones[j] else t
                if run.edges[j] and t.is_floating_point():
                    if t.requires_grad:
                        read.add(id(t))
                        t = t.view_as(t)
                    else:
                        t = t.detach().requires_grad_(True)
                    edges.append((i, j, t))
                else:
                    t = t.detach()
                # dense, as the layer-by-layer path reads it from the blob: a strided view
                # (a Slice or Crop top) takes other kernel paths, whose exp and friends can
                # round one ulp apart
                bottoms.append(t.contiguous())
            tops = tnet.run_step(step, bottoms)
            for k, w in run.loss_tops:
                loss += w * float(tops[k].detach().sum())
            if run.record:
                net._record(i, bottoms, tops)
                for name, t in zip(step.tops, tops):
                    values[name] = t
                    if t.requires_grad:
                        produced.append((name, t))
                        live.add(i)
            else:
                values.update(zip(step.tops, tops))
    finally:
        torch.set_grad_enabled(was_enabled)
    taken: set[int] = set()
    keys = net._lazy.keys
    for name, t in values.items():  # a blob ends with its last writer's top, as in Caffe
        if keys.get(name, name) != name:  # its memory is another blob's: that one's value
            if net._blob_of[name].shape != tuple(t.shape):
                net._reshape_blob(name, tuple(t.shape))
            continue
        fresh = t.grad_fn is not None and _sole(t, taken)  # an op's output, not a buffer
        net._store_top(name, t.detach(), device, adopt=fresh)
    seeds = [(name, t) for name, t in produced if id(t) not in read]
    edges = [e for e in edges if e[0] in live]
    grads, taken = _backward(net, plan, edges, seeds, device)
    _write_param_diffs(net, plan, grads, device, clear, taken)
    return loss


def _backward(
    net: Net,
    plan: OnePassPlan,
    edges: list[tuple[int, int, torch.Tensor]],
    seeds: list[tuple[str, torch.Tensor]],
    device: torch.device,
) -> tuple[list[torch.Tensor | None], set[int]]:
    """One autograd pass from ``seeds`` (top name, tensor); writes the bottom diffs (last
    layer first) as Caffe's Backward leaves them; returns the params' gradients and the
    buffers blobs hold now (``_sole``'s ``taken``)."""
    steps = net.module.steps
    inputs = [t for _, _, t in edges] + list(plan.params)
    if not seeds or not inputs:
        return [None] * len(plan.params), set()
    # blob -> the edge whose write Caffe's Backward (last layer first, each layer's bottoms
    # in order) leaves there: the first layer that reads it, its last such bottom. The
    # edges come in forward order, so no sort is needed.
    last: dict[str, int] = {}
    for e, (i, j, _) in enumerate(edges):
        name = steps[i].bottoms[j]
        first = last.get(name)
        if first is None or edges[first][0] == i:
            last[name] = e
    seed_diffs = [net._blob_of[name].diff_at(device) for name, _ in seeds]
    seeded = {name for name, _ in seeds}
    for name in last:  # the gradients' memory (SyncedMemory.release); seeds are read
        if name not in seeded:
            net._blob_of[name].diff_memory.release()
    got = torch.autograd.grad(
        [t for _, t in seeds],
        inputs,
        [d.view(t.shape).to(t.dtype) for d, (_, t) in zip(seed_diffs, seeds)],
        allow_unused=True,
        retain_graph=True,  # the records' graphs, for a later backward()
    )
    taken = {d.data_ptr() for d in seed_diffs}
    del seed_diffs  # views: a blob taking a gradient counts the views of its buffer
    # in Caffe's order (last layer first, each layer's bottoms in order): blobs sharing one
    # diff memory (a Flatten top and its bottom) end with the last write
    for name, e in sorted(last.items(), key=lambda item: (-edges[item[1]][0], item[1])):
        blob, g = net._blob_of[name], got[e]
        if g is None:
            blob.diff_to_overwrite(device).zero_()
        elif _sole(g, taken, views=True):
            blob.take_diff(g.reshape(blob.shape))
        else:
            blob.diff_to_overwrite(device).copy_(g.view(blob.shape))
    return list(got[len(edges) :]), taken


def _write_param_diffs(
    net: Net,
    plan: OnePassPlan,
    grads: list[torch.Tensor | None],
    device: torch.device,
    clear: bool,
    taken: set[int],
) -> None:
    """Accumulate each param's gradient into its diff (Caffe's param diffs add up); with
    ``clear``, each diff becomes ``grad + 0`` instead (zero where no gradient).

    With ``clear`` the ``+ 0`` runs in place on autograd's gradients (one foreach call), and
    a diff no one holds a view of adopts its gradient as the param's ``.grad`` and the
    blob's buffer (``_sole``, ``SyncedMemory.take``): no copy into the old buffer."""
    blobs = net._param_blob_of
    if not clear:
        for p, g in zip(plan.params, grads):
            if g is not None:
                blobs[id(p)].diff_at(device, mutable=True).add_(g.view(p.shape))
        return
    adopt: list[tuple[nn.Parameter, torch.Tensor]] = []
    written = set()
    for p, g in zip(plan.params, grads):
        if g is None:
            continue
        written.add(id(p))
        if g.dtype == p.dtype and g.is_contiguous() and _sole(g, taken, views=True):
            # not a view: a later take counts the views of this buffer (_viewed)
            adopt.append((p, g if g._base is None else g.detach()))
        else:
            torch.add(g.view(p.shape), 0.0, out=blobs[id(p)].diff_to_overwrite(device))
    if adopt:
        torch._foreach_add_([g for _, g in adopt], 0.0)  # Caffe's 0 + grad, -0 included
    for p, g in adopt:
        if blobs[id(p)].take_diff(g):  # else a held view saw it copied into the old buffer
            p.grad = g
    for key, blob in blobs.items():
        if key not in written:
            blob.diff_to_overwrite(device).zero_()


def _sole(t: torch.Tensor, taken: set[int], views: bool = False) -> bool:
    """Does ``t`` own its whole buffer, densely (contiguous or channels_last, as CPU pooling
    hands back gradients), not yet given to a blob in this pass (two tops or two gradients
    can be one tensor)? Then a blob may take it (``Blob.take_data``). ``views``: a view of
    a whole buffer will do (a gradient's base is another gradient, never a blob's buffer
    but a seed's diff, which ``taken`` holds); a top that is a view may be a blob's data."""
    if (t._base is not None and not views) or t.storage_offset():
        return False
    if not (t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)):
        return False
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return False
    ptr = t.data_ptr()
    if ptr in taken:
        return False
    taken.add(ptr)
    return True
