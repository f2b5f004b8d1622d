"""``make gpu-reproduce``: the KERPLE paper's Table 3 at the 162M scale on one GPU, in re-runnable chunks.

The command builds an offline corpus from the Python sources on the machine
(``prepare_data.py python``), trains each positional embedding with the paper's recipe
(``train.py``; ``configs/models/162M.yml``, KERPLE §5.1 Table 2) for a stated token budget,
evaluates each checkpoint at 512-16384 tokens (``evaluate.py``, non-overlapping windows, §5.2) and
writes the Table-3 layout, a perplexity-vs-length plot and per-run timings (docs/reproduce-162m.md
and a README section). Every stage runs the project's own entry point in a child process and
resumes from what is on disk, so a run stopped by its time limit, a signal or a lost machine
continues where it stopped when the same command is run again.

``--preset lease`` instead does one short reproduction that fits one GPU lease: a corpus capped in
tokens and time, training steps sized from a measured throughput to fit ``--minutes``, and a
report of four files in ``--output`` only, rewritten after every stage.

Modules: :mod:`.plan` (scales, budget, config arguments), :mod:`.state` (what earlier chunks did),
:mod:`kerple.jobs.process` (child processes with a deadline), :mod:`.stages` (corpus, training, evaluation),
:mod:`.report` (tables, plot, docs), :mod:`.cli` (the command); for the lease :mod:`.lease` (its
scales and the sizing rule), :mod:`.corpus` (the capped corpus), :mod:`.lease_run` (its stages) and
:mod:`.lease_report` (its report).
"""
