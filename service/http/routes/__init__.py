"""HTTP routes of the query service, one router per concern."""
