"""Recipes: the schema (`schema`), where recipe files live (`paths`), loading with ``extends:`` and variants
(`load`), and what the model and the node layout imply (`model_config`, `instances`)."""
