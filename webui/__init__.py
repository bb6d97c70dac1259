"""The dashboard (FastAPI). It only ever reads the experiments database."""
