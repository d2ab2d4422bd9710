"""Money, in one place: what a launch will cost (`launch_cost.py`), a run's hard budget
(`run_budget.py`), the ledger of what every sortie cost (`ledger.py`), owners' monthly budgets
(`budgets.py`), `sortie costs` (`summary.py`), and how an amount and a rate are written
(`money.py`). Below the backends, which record their costs here: it knows amounts, owners and
times, not sorties."""
