"""The only code that talks to an API server: client, caches, work queue, leader election."""
