"""The forward over a trie of shared prompt prefixes: every token prefix that two or more rows of a micro-batch
share runs once, with the gradient flowing back through it (training, :func:`trie_forward`), and generation's
prefill over the same trie (:func:`trie_prefill`, slea/policy/generation.py).

Rows of a GRPO group are G copies of one prompt, and rows of one game share its system text and goal. The
prompts form a radix tree (a trie whose edges are token segments): each node is a segment that several rows
continue from, each row continues from its deepest node. The forward runs the trie level by level, all
nodes of one depth as one left-padded batch after their ancestors' KV cache, then every row's own tokens (the
rest of its prompt and its response) after its deepest node's. This is the prefix-sharing forward of Prefix
Grouper (arXiv 2506.05433) and Tree Training (arXiv 2511.00413), with explicit ``position_ids`` and a 2-D
attention mask for the padding between the segments. The KV of a node reaches the rows that read it by slicing and
expanding, so autograd sums its gradient over them: the log-probs and the gradient of the weights are those of
the plain per-row forward, up to rounding (tests/policy/test_prefix.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from slea.device import model_device
from slea.policy.generation import checkpointing, left_pad


@dataclass(frozen=True)
class Node:
    """A shared segment of the trie: ``tokens`` at positions ``start, start + 1, ...``, after the segments of its
    ancestors; ``parent`` the index of the enclosing node (-1: none), ``depth`` 1 for a top node."""

    tokens: tuple[int, ...]
    start: int
    parent: int
    depth: int

    @property
    def end(self) -> int:
        """The position after the segment: the number of prompt tokens a row continuing from it has computed."""
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class PrefixTrie:
    """The shared prefixes of a micro-batch's prompts: ``nodes`` (a parent before its children) and each row's
    deepest node (``row_node``, -1: none)."""

    nodes: tuple[Node, ...]
    row_node: tuple[int, ...]

    @property
    def depth(self) -> int:
        """The number of levels (0: nothing shared)."""
        return max((n.depth for n in self.nodes), default=0)

    def level(self, depth: int) -> list[int]:
        """The nodes at ``depth``, in trie order."""
        return [i for i, n in enumerate(self.nodes) if n.depth == depth]

    def chain(self, node: int, depth: int) -> list[int]:
        """``node``'s ancestors at depths 1, 2, ... and ``node`` itself, padded with -1 to ``depth`` entries."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1] + [-1] * (depth - len(out))

    def own_start(self, row: int) -> int:
        """The first position of the row's own tokens (those after its deepest node)."""
        node = self.row_node[row]
        return self.nodes[node].end if node >= 0 else 0


def _common_end(bodies: Sequence[tuple[int, ...]], rows: list[int], start: int) -> int:
    """The end of the longest token run from ``start`` that every row of ``rows`` shares."""
    end, limit = start, min(len(bodies[r]) for r in rows)
    first = bodies[rows[0]]
    while end < limit and all(bodies[r][end] == first[end] for r in rows):
        end += 1
    return end


MIN_SAVED = 16  # token positions a shared run must save to become a node: each level is one more forward call
# The levels the update, the π_old pass and generation share by default: the prompts' common prefix alone. On the
# default job's own iterations the whole trie was slower per token (bench/results/prefix_job.json: training 0.67x,
# generation 0.80x), though it wins on turn-0 GRPO groups (bench/results/prefix_trie.json: 1.82x); None: every
# level.
DEFAULT_LEVELS: int | None = 1


def build_trie(prompts: Sequence[Sequence[int]], max_depth: int | None = None,
               min_saved: int = MIN_SAVED) -> PrefixTrie:
    """The radix tree of the prompts less their last token (the logit that predicts a row's first response token
    comes from that token, so every row keeps it as its own): a node for each token run that two or more rows
    share and whose single computation saves at least ``min_saved`` token positions ((rows − 1) x its length; a
    shorter run stays with the nodes or rows below it), nested; ``max_depth`` bounds the levels (1: one level,
    the micro-batch's common prefix when it has one; 0: none)."""
    bodies = [tuple(p[:-1]) for p in prompts]
    nodes: list[Node] = []
    row_node = [-1] * len(bodies)

    def split(rows: list[int], start: int, parent: int, depth: int) -> None:
        if max_depth is not None and depth > max_depth:
            return
        end = _common_end(bodies, rows, start)
        if end > start and (len(rows) - 1) * (end - start) >= min_saved:
            nodes.append(Node(bodies[rows[0]][start:end], start, parent, depth))
            parent, depth, start = len(nodes) - 1, depth + 1, end
            for r in rows:
                row_node[r] = parent
        groups: dict[int, list[int]] = {}
        for r in rows:
            if len(bodies[r]) > end:
                groups.setdefault(bodies[r][end], []).append(r)
        for group in groups.values():
            if len(group) > 1:
                split(group, start, parent, depth)

    if len(bodies) > 1:
        split(list(range(len(bodies))), 0, -1, 1)
    return PrefixTrie(tuple(nodes), tuple(row_node))


def fan_out(x: torch.Tensor, index: Sequence[int]) -> torch.Tensor:
    """``x[i]`` for each ``i`` of ``index`` along dim 0 (zeros for -1), by slicing and expanding each run of equal
    indices: the backward sums each row's gradient over its readers with no scatter (index-select's backward
    adds with atomics on more than one CPU thread, so its last bits change from run to run)."""
    parts = []
    for value, run in itertools.groupby(index):
        shape = (len(list(run)), *x.shape[1:])
        parts.append(x.new_zeros(shape) if value < 0 else x[value:value + 1].expand(shape))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class Level:
    """One computed level: each layer's keys and values of its segments, (nodes, heads, width, head dim), and
    their padding mask (nodes, width)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor


def _context(levels: list[Level], chains: list[list[int]]) -> Level | None:
    """The KV cache and mask the consumers read: for each computed level, the columns of each consumer's ancestor
    there (``chains[row][depth − 1]``, an index into that level; -1: zero columns, masked), side by side."""
    if not levels:
        return None
    picked = [[row[d] for row in chains] for d in range(len(levels))]
    kv = cast("list[tuple[torch.Tensor, torch.Tensor]]",  # each layer's keys and values: j in range(2)
              [tuple(torch.cat([fan_out(lv.kv[layer][j], idx) for lv, idx in zip(levels, picked)], dim=2)
                     for j in range(2)) for layer in range(len(levels[0].kv))])
    mask = torch.cat([fan_out(lv.mask, idx) for lv, idx in zip(levels, picked)], dim=1)
    return Level(kv, mask)


def _run(module, context: Level | None, seqs: list[list[int]], starts: list[int], *, logits_to_keep: int,
         keep_cache: bool):
    """``module`` over the left-padded ``seqs``, each after its ``context`` row and at positions from its
    ``start``: ``(output, ids, level)``, ``level`` the new segments' KV (``keep_cache``) or None."""
    from transformers import DynamicCache

    ids, attn = left_pad(seqs, 0, model_device(module))
    dev = ids.device
    pos = (torch.tensor(starts, device=dev).unsqueeze(1) + attn.cumsum(-1) - 1).clamp(min=0)
    if context is None and not keep_cache:  # the plain forward
        out = module(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=logits_to_keep,
                     use_cache=False)
        return out, ids, None
    config = getattr(module, "config", None) or module.get_base_model().config  # a peft wrapper has none
    width = 0 if context is None else context.mask.shape[1]
    cache = DynamicCache(ddp_cache_data=None if context is None else context.kv, config=config)
    mask = attn if context is None else torch.cat([context.mask.to(attn.dtype), attn], dim=1)
    out = module(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                 logits_to_keep=logits_to_keep)
    level = Level([(layer.keys[:, :, width:], layer.values[:, :, width:]) for layer in out.cache.layers], attn)
    return out, ids, level if keep_cache else None


def refuse_checkpointing(module) -> None:
    """Raise if ``module`` would drop the KV cache the shared prefixes pass it: gradient-checkpointed layers, in
    training with gradients."""
    if torch.is_grad_enabled() and module.training and checkpointing(module):
        raise RuntimeError("the shared-prefix forward needs each layer's KV cache, which a gradient-checkpointed "
                           "layer drops in training: run the plain forward (share_prefix=False)")


def _levels(module, trie: PrefixTrie) -> tuple[list[Level], dict[int, int]]:
    """Every node of ``trie`` computed once, level by level (all nodes of one depth as one left-padded batch after
    their ancestors' KV cache, the LM head on one position): the levels' KV, and each node's row in its level."""
    if trie.nodes:
        refuse_checkpointing(module)
    slot = {n: trie.level(node.depth).index(n) for n, node in enumerate(trie.nodes)}
    levels: list[Level] = []
    for depth in range(1, trie.depth + 1):
        members = trie.level(depth)
        chains = [[slot[a] for a in trie.chain(trie.nodes[n].parent, depth - 1)] for n in members]
        _, _, level = _run(module, _context(levels, chains), [list(trie.nodes[n].tokens) for n in members],
                           [trie.nodes[n].start for n in members], logits_to_keep=1, keep_cache=True)
        assert level is not None  # keep_cache=True
        levels.append(level)
    return levels, slot


def _rows(module, trie: PrefixTrie, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
          logits_to_keep: int, keep_cache: bool):
    """``_run`` of every row's own tokens (the rest of its prompt after its deepest node, then its response)
    after the KV of the trie's nodes: ``(output, ids, context, own)``, ``context`` the nodes' KV and mask the
    rows read (None: an empty trie), ``own`` the rows' own segments (``keep_cache``; else None)."""
    levels, slot = _levels(module, trie)
    chains = [[slot.get(a, -1) for a in trie.chain(node, trie.depth)] for node in trie.row_node]
    starts = [trie.own_start(r) for r in range(len(prompts))]
    seqs = [list(p[s:]) + list(resp) for p, s, resp in zip(prompts, starts, responses)]
    context = _context(levels, chains)
    out, ids, own = _run(module, context, seqs, starts, logits_to_keep=logits_to_keep, keep_cache=keep_cache)
    return out, ids, context, own


def trie_forward(module, trie: PrefixTrie, prompts: Sequence[Sequence[int]],
                 responses: Sequence[Sequence[int]], *, logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, ids)``: the causal LM ``module`` over each row's ``prompt + response``, with every node of
    ``trie`` computed once (its levels as batches, the LM head on one position), then the rows' own tokens after
    their deepest node's KV. ``ids``: the rows' own tokens, left-padded; ``logits``: those of its last
    ``logits_to_keep`` columns. An empty trie is the plain left-padded forward."""
    out, ids, _, _ = _rows(module, trie, prompts, responses, logits_to_keep=logits_to_keep, keep_cache=False)
    return out.logits, ids


def trie_prefill(module, trie: PrefixTrie, prompts: Sequence[Sequence[int]]):
    """The prefill of generation over ``trie``: ``(logits, cache, mask, last_pos)`` — each prompt's next-token
    logits (rows, vocab), the KV cache of every row's whole prompt (the nodes' segments fanned out, then its own
    tokens), its attention mask (0 on the padding between segments) and each row's last position, from which
    decoding continues. With a trie of one node (the prompts' common prefix) this is the computation of a common
    prefix at batch 1 followed by the left-padded rests."""
    out, _, context, own = _rows(module, trie, prompts, [()] * len(prompts), logits_to_keep=1, keep_cache=True)
    assert own is not None  # keep_cache=True
    mask = own.mask if context is None else torch.cat([context.mask.to(own.mask.dtype), own.mask], dim=1)
    starts = torch.tensor([trie.own_start(r) for r in range(len(prompts))], device=mask.device)
    return out.logits[:, -1], out.cache, mask, starts + own.mask.sum(-1) - 1
