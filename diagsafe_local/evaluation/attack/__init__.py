"""Adaptive attacks: every harmful item's request becomes a goal, and an attacker model attacks it chain by chain.

One module per part: `config` (the run config's `attack:` section, whose knobs each strategy owns), `strategy`
(what a strategy is, and their registry: built-ins and plugins alike, through the entry-point group
`diagsafe_local.attack_strategies`), `pair` and `crescendo` (the built-in strategies), `prompts` (what every
attacker is shown and must reply), `step` (the scheduler that runs the chains on the engines). What a run's attack
steps add up to is read side: `runs.attack_figures`.
"""
