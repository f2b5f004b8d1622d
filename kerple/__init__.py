"""kerple: length-extrapolating transformer language models."""
