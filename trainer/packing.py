"""Training sequences → packed rows: padding-free micro-batches by token budget, each group's shared prefix
computed once.

A row is one forward pass (batch of one, so nothing is padded). It holds *blocks* of tokens: a plain
sequence is one block; a group whose sequences start with the same tokens (the served prompt: system
prompt, tool schemas, task) becomes one *prefix* block followed by one *suffix* block per sequence. The
attention mask lets each token see the earlier tokens of its own block and, for a suffix, the whole prefix;
position ids continue from the prefix. Forward outputs are therefore those of the sequences run one by one
(Prefix Grouper, Liu et al. 2025, arXiv 2506.05433), and so are the loss and its gradients.

Each trained token is read at the position that predicts it: inside its block, or — for a token of the
shared prefix or the first token of a suffix — the prefix's position before it. The shared prefix is the
group's longest common token prefix, trained tokens included: multi-turn trajectories whose early turns
coincide share those turns too, and each trajectory's trained tokens there are read (and scored, with its own
advantage and sampled logprobs) at the one shared position. A group whose sequences share more in subsets
than all together (one sequence that diverges early, e.g. after a context break) is split into the subsets
that save the most tokens (`best_sharing`).

The mask is a boolean [T × T] given to the model as a 4-D attention mask (SDPA takes it as it is, eager
attention as an additive one: `ruler_rl.trainer.training`); a row of one sequence gets none (`Row.needs_mask`): the
model's own causal mask is the same, and SDPA then runs its causal kernels. Models whose attention cannot take
one (flash_attention_2, or layers with a sliding window or chunked attention, whose own masks a 4-D mask would
replace) get one sequence per row, counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ruler_rl.trainer.sequences import TrainingSequence

MASKABLE_ATTENTION = ("sdpa", "eager", "sdpa_blocks")  # sdpa_blocks: ruler_rl.trainer.attention.BLOCK_ATTENTION


@dataclass
class Row:
    """One forward pass: tokens, their position ids, each token's block, each block's parent (-1: none),
    and for every trained token the position that predicts it, its id, its sequence's index in the batch."""
    token_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    block_of: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    predict_at: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    sequence_of: list[int] = field(default_factory=list)
    token_index: list[int] = field(default_factory=list)  # the trained token's index in its sequence

    def __len__(self) -> int:
        return len(self.token_ids)

    def add_block(self, tokens: list[int], start_position: int, parent: int = -1) -> int:
        block = len(self.parents)
        self.parents.append(parent)
        self.token_ids += tokens
        self.position_ids += range(start_position, start_position + len(tokens))
        self.block_of += [block] * len(tokens)
        return block

    def add_trained(self, seq: TrainingSequence, index: int, offset: int, prefix_len: int = 0,
                    prefix_start: int = -1) -> None:
        """Record `seq`'s trained tokens; its tokens from `prefix_len` on start at row position `offset`
        (those before are the shared prefix, starting at row position `prefix_start`)."""
        for k in range(1, len(seq.token_ids)):
            if seq.trained[k]:
                self.predict_at.append(prefix_start + k - 1 if k <= prefix_len else offset + k - 1 - prefix_len)
                self.targets.append(seq.token_ids[k])
                self.sequence_of.append(index)
                self.token_index.append(k)

    def needs_mask(self) -> bool:
        """Whether the row needs its 4-D mask: more than one block (packed sequences, or a shared prefix and its
        suffixes). A row of one block is one sequence, for which the model's own causal mask is the same mask:
        it gets none, so SDPA can take its causal kernels (flash; no [T x T] mask on the device)."""
        return len(self.parents) > 1  # a row's first block has no parent: a parent is an earlier block

    def spans(self) -> list[tuple[int, int, int, int]]:
        """(start, end, parent start, parent end) of each block in row order, the parent's -1, -1 when it has
        none: the row's mask as `ruler_rl.trainer.attention` takes it (a block's tokens are contiguous, blocks in
        order). Built once per row, as `attention_mask` is (a row is run up to three times and counted once)."""
        cached = getattr(self, "_spans", None)
        if cached is not None and cached[0] == len(self.block_of):
            return cached[1]
        bounds: list[list[int]] = [[-1, -1] for _ in self.parents]
        for t, b in enumerate(self.block_of):
            if bounds[b][0] < 0:
                bounds[b][0] = t
            bounds[b][1] = t + 1
        spans = [(s, e, *(bounds[p] if p >= 0 else (-1, -1)))
                 for (s, e), p in zip(bounds, self.parents, strict=True) if s >= 0]
        self._spans = (len(self.block_of), spans)
        return spans

    def block_copy_tokens(self) -> int:
        """Prefix tokens the block attention copies: each suffix's parent's length, summed."""
        return sum(pe - ps for _, _, ps, pe in self.spans() if ps >= 0)

    def attention_mask(self):
        """[T, T] bool: query t sees key s when both are in one block and s <= t, or s is in t's parent.
        Built once per row (a row is run up to three times: old, reference and current logprobs)."""
        import torch

        cached = getattr(self, "_mask", None)
        if cached is not None and cached.shape[0] == len(self.block_of):
            return cached
        block = torch.tensor(self.block_of)
        parent_of_block = torch.tensor(self.parents)
        idx = torch.arange(len(block))
        same = (block[:, None] == block[None, :]) & (idx[None, :] <= idx[:, None])
        self._mask = same | (parent_of_block[block][:, None] == block[None, :])
        return self._mask


@dataclass
class PackReport:
    sequence_tokens: int = 0       # tokens of the sequences as they are
    forward_tokens: int = 0        # tokens run forward after sharing prefixes
    rows: int = 0
    shared_groups: int = 0         # shared prefixes (a group's sequences that begin alike), each computed once
    no_shared_prefix: int = 0      # groups of 2+ sequences with nothing shared: no common prefix of the minimum
    unmaskable_fallback: int = 0   # sequences given a row each: the model's attention takes no 4-D mask

    @property
    def saving(self) -> float:
        """The fraction of the sequences' tokens not run forward thanks to shared prefixes (0 when none)."""
        return 1 - self.forward_tokens / self.sequence_tokens if self.sequence_tokens else 0.0


def common_prefix(seqs: list[TrainingSequence], start: int = 0) -> int:
    """Length of the longest common token prefix of `seqs` (trained tokens included), comparing from token
    `start` on (the caller knows the tokens before it are common)."""
    first = seqs[0].token_ids
    n = min(len(s.token_ids) for s in seqs)
    k = min(start, n)
    while k < n and all(s.token_ids[k] == first[k] for s in seqs):
        k += 1
    return k


def best_sharing(seqs: list[TrainingSequence], members: list[int], min_prefix: int) -> tuple[int, list]:
    """(tokens saved, units) of the one-level sharing of `members` that saves the most forward tokens: all of
    them behind their common prefix, or — recursively — the subsets that continue alike after it (the
    sequences split by the token that follows the common prefix). A unit is `(prefix length, [indices])`,
    prefix 0 for a sequence run alone; a prefix shorter than `min_prefix` is not shared. The tree of subsets is
    walked with a stack of its own (no recursion limit), each level comparing tokens from where its parent
    stopped."""
    nodes: list[dict] = [{"members": list(members), "start": 0}]
    order, stack = [], [0]
    while stack:  # top-down: each node's common prefix and its subsets
        n = stack.pop()
        order.append(n)
        node = nodes[n]
        if len(node["members"]) < 2:
            continue
        prefix = node["prefix"] = common_prefix([seqs[i] for i in node["members"]], node["start"])
        after: dict[object, list[int]] = {}
        for i in node["members"]:  # a sequence ending at the common prefix is alone
            tokens = seqs[i].token_ids
            after.setdefault(tokens[prefix] if len(tokens) > prefix else ("ends", i), []).append(i)
        node["kids"] = []
        for subset in after.values():
            nodes.append({"members": subset, "start": prefix + 1})
            node["kids"].append(len(nodes) - 1)
            stack.append(len(nodes) - 1)
    for n in reversed(order):  # bottom-up: the better of sharing here and the subsets' best
        node = nodes[n]
        if len(node["members"]) < 2:
            node["best"] = (0, [(0, list(node["members"]))])
            continue
        whole = (len(node["members"]) - 1) * node["prefix"] if node["prefix"] >= min_prefix else 0
        saved, units = 0, []
        for kid in node["kids"]:
            saved += nodes[kid]["best"][0]
            units += nodes[kid]["best"][1]
        # nothing shared here (whole 0): the subsets' units, which are single sequences when they save 0 too
        if saved > whole or whole == 0:
            node["best"] = (saved, units)
        else:
            node["best"] = (whole, [(node["prefix"], list(node["members"]))])
    return nodes[0]["best"]


def pack(seqs: list[TrainingSequence], *, capacity: int, share_prefix: bool = True, min_prefix: int = 32,
         maskable: bool = True) -> tuple[list[Row], PackReport]:
    """Rows of at most `capacity` tokens (a longer unit gets a row of its own), largest first; a group's
    sequences that share at least `min_prefix` leading tokens run that prefix once."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1 token, got {capacity!r}")
    if isinstance(min_prefix, bool) or not isinstance(min_prefix, int) or min_prefix < 1:
        raise ValueError(f"min_prefix must be an int >= 1 token, got {min_prefix!r}")
    report = PackReport(sequence_tokens=sum(len(s.token_ids) for s in seqs))
    if not maskable:  # one plain sequence per row: the model's own causal mask is right for it
        rows = []
        for i, s in enumerate(seqs):
            row = Row()
            row.add_block(s.token_ids, 0)
            row.add_trained(s, i, 0)
            rows.append(row)
        report.unmaskable_fallback = len(seqs)
        report.rows, report.forward_tokens = len(rows), report.sequence_tokens
        return rows, report

    # units: (prefix length, [sequence indices]); prefix 0 means plain sequences
    units: list[tuple[int, list[int]]] = []
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_group.setdefault(s.group, []).append(i)
    for members in by_group.values():
        # sequences of a group that begin alike (their first `min_prefix` tokens) may share a prefix; a
        # multi-turn trajectory's later sequence or an edited history simply starts its own bucket
        buckets: dict[tuple, list[int]] = {}
        for i in members:
            key = tuple(seqs[i].token_ids[:min_prefix]) if share_prefix else (i,)
            buckets.setdefault(key if len(key) == min_prefix else (i,), []).append(i)
        shared = False
        for bucket in buckets.values():
            for prefix, sharing in best_sharing(seqs, bucket, min_prefix)[1]:
                if not prefix:
                    units.append((0, sharing))
                    continue
                # split the suffixes so that each tree fits (the prefix is repeated in each part); a part of
                # one sequence shares nothing: it runs as a plain sequence (sharing needs a capacity of at
                # least the prefix and two suffixes)
                parts: list[list[int]] = []
                part: list[int] = []
                size = prefix
                for i in sorted(sharing, key=lambda j: -len(seqs[j].token_ids)):
                    extra = len(seqs[i].token_ids) - prefix
                    if part and size + extra > capacity:
                        parts.append(part)
                        part, size = [], prefix
                    part.append(i)
                    size += extra
                parts.append(part)
                if any(len(p) > 1 for p in parts):
                    shared = True
                    report.shared_groups += 1
                units += [(prefix, p) if len(p) > 1 else (0, p) for p in parts]
        if share_prefix and len(members) > 1 and not shared:
            report.no_shared_prefix += 1

    def unit_size(unit):
        prefix, members = unit
        return prefix + sum(len(seqs[i].token_ids) - prefix for i in members)

    rows: list[Row] = []
    room: list[int] = []
    for unit in sorted(units, key=unit_size, reverse=True):  # first fit, largest first
        size = unit_size(unit)
        slot = next((r for r, free in enumerate(room) if free >= size), None)
        if slot is None:
            rows.append(Row())
            room.append(capacity)
            slot = len(rows) - 1
        row = rows[slot]
        room[slot] -= size
        prefix, members = unit
        if prefix:
            start = len(row)
            parent = row.add_block(seqs[members[0]].token_ids[:prefix], 0)
            for i in members:
                offset = len(row)
                row.add_block(seqs[i].token_ids[prefix:], prefix, parent)
                row.add_trained(seqs[i], i, offset, prefix_len=prefix, prefix_start=start)
        else:
            (i,) = members
            offset = len(row)
            row.add_block(seqs[i].token_ids, 0)
            row.add_trained(seqs[i], i, offset)
    report.rows = len(rows)
    report.forward_tokens = sum(len(r) for r in rows)
    return rows, report
