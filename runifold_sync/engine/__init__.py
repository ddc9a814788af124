"""The replay of one claim: what ``ctx`` stands in front of while a task runs."""
