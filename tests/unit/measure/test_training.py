"""kerple.measure.training: the synthetic corpus and FLOPs per token (PaLM, Appendix B) against a
count made from the config alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kerple.config import load_config
from kerple.data.indexed_dataset import MMapIndexedDataset
from kerple.measure.training import flops_per_token, write_random_corpus
from kerple.model import build_model

TINY = str(Path(__file__).resolve().parents[3] / "configs" / "models" / "tiny.yml")


def test_the_random_corpus_holds_whole_documents_of_the_vocabulary(tmp_path: Path) -> None:
    write_random_corpus(tmp_path / "corpus", vocab=300, tokens=5 * 2048 + 100)
    dataset = MMapIndexedDataset(tmp_path / "corpus")
    assert len(dataset) == 8  # at least 8 documents, however few tokens are asked for
    documents = [dataset[i] for i in range(len(dataset))]
    assert all(len(doc) == 2048 and doc.dtype == np.uint16 for doc in documents)
    tokens = np.concatenate(documents)
    assert tokens.min() >= 0 and tokens.max() < 300 and len(np.unique(tokens)) == 300


@pytest.mark.parametrize("pos_emb", ["none", "learned"])
@pytest.mark.parametrize("tied", [False, True])
def test_flops_per_token_counts_every_matmul_parameter_once_and_no_table(pos_emb: str, tied: bool) -> None:
    cfg = load_config([TINY], {"pos_emb": pos_emb, "no_weight_tying": not tied})
    model = build_model(cfg)
    h, layers, vocab, seq = (cfg.model.hidden_size, cfg.model.num_layers, cfg.model.padded_vocab_size,
                             cfg.model.seq_length)
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h  # qkv, dense, MLP, 2 norms
    matmul_params = layers * per_layer + 2 * h + vocab * h  # + final norm + the LM head, tied or not
    # the word table is the LM head when tied: the model then holds vocab * h fewer parameters
    assert sum(p.numel() for p in model.parameters()) == matmul_params + (0 if tied else vocab * h) + (
        cfg.model.max_position_embeddings * h if pos_emb == "learned" else 0)
    assert flops_per_token(model, layers, h, seq) == 6 * matmul_params + 12 * layers * h * seq
