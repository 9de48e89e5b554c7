"""The rules engine: deterministic answers, the rule file and the small intent
classifier.
"""
