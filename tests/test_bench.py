"""The decoder bench's account of the weights a one-frame push reads, and its bandwidth probe."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import pytest
from kazeia_dev.bench.decoder import (
    decoder_columns_per_frame,
    gguf_u32_list,
    streamed_weight_mb,
)

from wyoming_kazeia import _native


@pytest.mark.parametrize("model", ["tiny-0.6b", "tiny-1.7b"])
def test_columns_per_frame_follow_the_upsampling(decoder_gguf: dict[str, Path], model: str) -> None:
    reader = gguf.GGUFReader(decoder_gguf[model])

    def u32(key: str) -> list[int]:
        return gguf_u32_list(reader, f"kazeia.decoder.{key}")

    ratios, rates, hop = u32("upsampling_ratios"), u32("upsample_rates"), u32("hop_length")[0]
    columns = {
        t.name: decoder_columns_per_frame(t.name, ratios, rates)
        for t in reader.tensors
        if len(t.shape) == 2 and "codebook" not in t.name and "dwconv" not in t.name
    }
    assert columns["dec.voc.conv_out.weight"] == hop  # the last conv runs at the sample rate
    assert columns["dec.tfm.blk.0.attn_q.weight"] == columns["dec.pre_conv.weight"] == 1
    assert columns["dec.up.0.trans.weight"] == 1 and columns["dec.up.0.pwconv1.weight"] == ratios[0]
    assert columns["dec.voc.conv_in.weight"] == math.prod(ratios)
    assert columns["dec.voc.blk.0.up.weight"] == math.prod(ratios)
    assert columns["dec.voc.blk.0.res.0.conv1.weight"] == math.prod(ratios) * rates[0]

    total, low = streamed_weight_mb(decoder_gguf[model])
    matrices = sum(int(t.n_bytes) for t in reader.tensors if t.name in columns) / 1e6
    assert total == pytest.approx(matrices) and 0 < low < total


def test_read_bandwidth_measures_and_rejects_bad_arguments() -> None:
    assert 0.1 < _native.testing.read_bandwidth(16, 2) < 10_000  # GB/s
    with pytest.raises(ValueError, match="read_bandwidth"):
        _native.testing.read_bandwidth(0, 2)
