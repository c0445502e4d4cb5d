"""A preallocated KV cache in which every row of the batch has its own length.

Speculative decoding with batch > 1 accepts a different number of tokens in every row, so the
rows' sequences grow raggedly. Rather than padding the batch to its slowest row, compacting the
cache every step, or leaving masked holes where rejected drafts were, each row is kept contiguous
and left-aligned: row b's token at position t lives in column t, columns [0, lengths[b]) are
valid. A forward pass writes its T new keys/values at columns lengths[b] .. lengths[b] + T - 1 of
each row (a scatter), and a rollback after rejection is only a smaller lengths[b]: the rejected
columns are overwritten by the next write. Attention sees columns [0, max(lengths) + T) under a
per-row causal mask, and positions (RoPE) are per row, so a row's output does not depend on the
other rows.

The buffers are allocated once, for the batch the run starts with. Finished rows leave the batch
by compaction in place (the remaining rows move to the front), so addresses never change: a
fixed-shape step (`specbench.native.graphs`) can attend over the first `rows` rows and a fixed number
of columns (`bind`'s `visible`) under the same mask and be replayed as a CUDA graph.

The object is duck-typed to what transformers' attention layers call, `update(k, v, layer_idx)`,
so any decoder that takes `past_key_values`, `position_ids` and a 4-D mask can use it.
"""

from __future__ import annotations

import torch


def to_device(values, device: torch.device | str) -> torch.Tensor:
    """Host integers (a list or an array) as a long tensor on `device`. On CUDA through pinned
    memory, without blocking: a plain copy from pageable memory first waits for the device's
    queue to drain, which would stall the host at every step of the loop."""
    host = torch.tensor(values, dtype=torch.long)  # a copy: later host writes do not reach it
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class RaggedKVCache:
    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_length: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layer_devices: list[torch.device] | None = None,  # a model spread over devices: each layer's
    ) -> None:
        shape = (batch_size, num_kv_heads, max_length, head_dim)
        layer_devices = layer_devices or [torch.device(device)] * num_layers
        self.keys = [torch.zeros(shape, dtype=dtype, device=d) for d in layer_devices]
        self.values = [torch.zeros(shape, dtype=dtype, device=d) for d in layer_devices]
        self.max_length = max_length
        self.device = torch.device(device)  # where positions, masks and lengths live
        self.allocated_bytes = self.nbytes()
        # Host copy of the lengths: the loop needs them on the host anyway (slicing, bookkeeping).
        self.lengths: list[int] = [0] * batch_size
        self._write_index: dict[torch.device, torch.Tensor] = {}
        self._visible_length = 0
        self._rows = batch_size  # rows a forward pass covers (a fixed-shape step pads past the batch)
        self._first_row = 0  # ... starting here (a prefill may run the batch in groups of rows)

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def allocated_rows(self) -> int:
        return self.keys[0].shape[0]

    def reset(self, batch_size: int) -> None:
        """Empty the cache for a new batch of at most `allocated_rows` rows (buffers reused)."""
        if batch_size > self.allocated_rows:
            raise ValueError(f"cache has {self.allocated_rows} rows, batch needs {batch_size}")
        self.lengths = [0] * batch_size

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def prepare(self, num_new: int, attention: str = "sdpa", rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a forward pass that appends `num_new` tokens to every row (or to `rows`, a
        contiguous range of them).

        Returns (position_ids [R, T], attention mask [R, 1, T, visible]) for the model call.
        """
        positions = self.next_positions(num_new, rows)
        first = rows.indices(self.batch_size)[0]
        return positions, self.bind(positions, max(self.lengths[rows]) + num_new, attention, first)

    def next_positions(self, num_new: int, rows: slice = slice(None)) -> torch.Tensor:
        """[R, T]: where each row's next `num_new` tokens go (also their RoPE positions)."""
        lengths = self.lengths[rows]
        if max(lengths) + num_new > self.max_length:
            raise ValueError(
                f"KV cache overflow: {max(lengths)} + {num_new} > {self.max_length} columns"
            )
        return to_device(lengths, self.device)[:, None] + torch.arange(num_new, device=self.device)[None, :]

    def bind(self, positions: torch.Tensor, visible: int, attention: str = "sdpa", first_row: int = 0) -> torch.Tensor:
        """Point the next forward's writes at `positions` [R, T] (rows first_row .. first_row +
        R - 1 of the buffers) and return its mask [R, 1, T, visible]. Only device ops on
        `positions`: a CUDA graph captured around this call replays with whatever its positions
        buffer then holds."""
        self._write_index = {self.device: positions[:, None, :, None]}
        self._visible_length = visible
        self._rows = positions.shape[0]
        self._first_row = first_row
        columns = torch.arange(visible, device=self.device)
        mask = columns[None, None, None, :] <= positions[:, None, :, None]  # [R, 1, T, visible]
        if attention == "eager":
            dtype = self.keys[0].dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill_(
                ~mask, torch.finfo(dtype).min
            )
        return mask

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        index = self._write_index.get(key_states.device)
        if index is None:  # a layer on another device: the same index, copied there once per step
            index = self._write_index[key_states.device] = self._write_index[self.device].to(key_states.device)
        index = index.expand(-1, key_states.shape[1], -1, key_states.shape[3])
        rows, visible = slice(self._first_row, self._first_row + self._rows), self._visible_length
        keys, values = self.keys[layer_idx][rows], self.values[layer_idx][rows]
        keys.scatter_(2, index, key_states)
        values.scatter_(2, index, value_states)
        return keys[:, :, :visible], values[:, :, :visible]

    def set_lengths(self, lengths: list[int]) -> None:
        """Commit: row b keeps its first lengths[b] columns (an advance or a rollback)."""
        self.lengths = list(lengths)

    def select_rows(self, rows: list[int]) -> None:
        """Keep only `rows` (finished rows leave the batch): they move, in order, to the front of
        the same buffers."""
        if rows != list(range(len(rows))):
            index = torch.tensor(rows, dtype=torch.long)
            on = {device: index.to(device) for device in {t.device for t in self.keys}}
            for buffer in self.keys + self.values:
                buffer[: len(rows)].copy_(buffer.index_select(0, on[buffer.device]))
        self.lengths = [self.lengths[r] for r in rows]

    # transformers calls these on some paths; they describe the longest row.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths) if self.lengths else 0

    def __len__(self) -> int:
        return len(self.keys)
