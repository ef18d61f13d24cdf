"""Live operations: living with a policy on a router.

Where the compiler stops at a script, this layer works on the running kernel: ``plan`` (what
would change, by the policy's names and lines), ``apply`` (the smallest safe change, in place
where the kernel can, with a snapshot restored on failure, and ``--confirm``), ``rollback``,
``status`` (the live tree's counters by class name), ``down`` (remove what a policy owns) and
``import`` (a policy from a live configuration). The compiler core never imports it.
"""
