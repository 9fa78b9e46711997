"""Compare mode: the same prompt to several backends, blind votes, and what the votes say."""
