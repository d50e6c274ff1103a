"""The start-up check of the whole configuration.

Every command (compute-agent, compute-agent-manage, compute-agent-ctl) runs
``check_config`` (whole.py) right after reading its config files and before
it writes anything or starts a thread. It reads every registered option of
every group (ours, oslo.log's, oslo.messaging's, keystoneauth's and the
``[placement]`` auth plugin's own) and refuses the first bad one with a
ConfigError of one line: ``[section] option: reason (value: ...)``. A
secret's value is never shown (``***``); a URL is shown with its password
masked.

oslo.config checks a value's type and its declared bounds when the value
is first read; the rules here add what a type cannot say: bounds for the
libraries' numbers (which declare none), finite floats, paths that exist,
URLs that parse, names Placement accepts, and the options an auth plugin
cannot do without. A string option that no rule checks is listed in
FREE_FORM with the reason any value is valid.

In order, each module importing only those before it: options.py (the
registry, where a value was written, how it is shown), value_rules.py (rules
on one value, and a refusal's line), names.py (names nothing reads:
misspelt or another version's), whole.py (rules on several options, and
the check itself).
"""
