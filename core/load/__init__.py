"""The one load engine (runner.py), its statistics, prompt sets, memory readings and the
article's benchmark: `python -m bench`, the chat's /bench and its simulations all use it."""
