"""Regular-language tasks (thesis §6.4.1) and the length-generalization benchmark of Table 6.1."""
