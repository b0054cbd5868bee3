"""Deploying across machines that do not trust each other: credentials (a CA, the SuperLink's
certificate, the nodes' keys), the operator's SuperLink connection, the fleet proxy that lets
nodes reach only the Fleet API, node registration, and each data owner's share of a dataset for
a demo federation."""
