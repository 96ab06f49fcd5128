"""Query-time scoring shared by evaluation, calibration and the service: the exact re-rank of
a shortlist (rerank) and every uncertainty score of a query (query_scores)."""
