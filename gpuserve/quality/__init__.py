"""Output quality of a launch against its checkpoint's reference: the prompt set
(prompts.py), the reply parser (parser.py), the metrics (metrics.py), the thresholds
(thresholds.py), the records (record.py) and the judge (judge.py). Pure logic; the
serve deploy runs it through roles/checks/quality.py. What and why: docs/quality.md.
"""
