"""Offline batch jobs: JSONL files of requests on the bulk lane
(``laneway batch``; see README, "Offline batch jobs")."""
