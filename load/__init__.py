"""The classroom load test: a Chainlit socket.io client, Locust users and the run summary (see docs/deploying/load-test.md)."""
