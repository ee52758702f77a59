"""The ingest stage: Wikipedia dumps (plain, bz2, multistream), wikitext cleaning, 100-word passages."""
