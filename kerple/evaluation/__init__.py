"""Length-extrapolation evaluation (KERPLE paper §5.2, §5.5, Appendix A.5; thesis §4.3.3-4.3.4).

``protocols`` lays out windows over a token stream, ``runner`` scores them, ``cli`` is
``evaluate.py``, ``stats`` and ``compare`` build Table 3, ``plots`` draws Figures 2-7.
"""
