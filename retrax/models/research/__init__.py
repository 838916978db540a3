"""Research model building blocks (Trax module path `trax.models.research`)."""
