"""One-off measurements, each a script that prints its figures and ends with a verdict
(`python -m experiments.NAME`)."""
