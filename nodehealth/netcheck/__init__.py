"""Analysis across nodes: pure functions over summaries (no sockets), tested at 10,000 nodes."""
