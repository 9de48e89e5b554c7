"""`laneway top`: scraping a running stack (`live`) and the view drawn from
the scrapes (`view`)."""
