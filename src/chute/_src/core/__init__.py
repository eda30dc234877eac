"""The engine's core: the stage contract, the dataset types, iterators and their states, options, errors, seeding and trees. Imports nothing from the other rooms."""
