"""DCFL (dataset condensation for federated learning) in one package, its two halves apart:

- the clients': settings.py (what they read of the ``strategy`` section, DP-DM's plan, the
  condensed-set check), condense.py (DM, DC, DSA), client.py (condensing, the two training
  stages);
- the server's: strategy.py (pre-training, the condensed-set store, the complementary groups),
  selection.py and cka.py (CKA-guided selection), condensed.py (the checks of a client's set),
  shipped.py (what leaves the clients, said before it does).

As everywhere in driftfl, the clients' half and the server's never import each other; they
agree through driftfl.common (the wire protocol) and settings.py.
"""
