"""The teaching tools, on the compiler's IR: ``explain`` (a policy in words), ``classify``
(which class a packet ends in, and why), ``simulate`` and ``measure`` (flows through a policy,
predicted and on a kernel), with ``traffic`` (packet and flow specs) and ``report`` (tables and
plots). Nothing in the compiler imports this layer.
"""
