"""``analyze.py``: why and where a trained model extrapolates (thesis chapters 2, 4.5 and 5).

One module per subcommand: :mod:`.receptive_field` (§4.5.1), :mod:`.attention_stats` (Table 5.1),
:mod:`.align_temperature` (Algorithm 1), :mod:`.retrieval` (chapter 5's passkey and line
retrieval), :mod:`.nope_variance` (§2.3, Lemma 2.3) and :mod:`.position_probe` (Fig. 2.2);
:mod:`.common` holds what they share and :mod:`.cli` the command line.
"""
