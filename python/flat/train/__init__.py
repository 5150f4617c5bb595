"""flat.train: small models trained with flat's layers, as a user would try the library first.
``python -m flat.train --help``; the models in flat.train.model, the tasks in flat.train.tasks."""
