"""The product's logic without Chainlit: replies, rounds, the disclosure rule, the one stream
loop, the load engine and its statistics, ratings. Nothing here imports Chainlit."""
