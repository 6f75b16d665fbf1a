"""Running learners on datasets with an engine, and writing the results."""
