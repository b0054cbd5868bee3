"""The methods' server halves, one a file named after the method (and what two of them share:
teacher.py, prototypes.py, aux_set.py); driftfl.methods binds each to its name and objective."""
