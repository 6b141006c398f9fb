"""What the test modules share; a test module imports from here, never from another test module.

``pyproject.toml`` puts ``tests/`` on ``sys.path`` (``pythonpath``), so every test folder imports these as
``helpers.<module>``; ``tests/test_layering.py`` checks that no test module imports another.

- :mod:`helpers.cli`: the real CLI in a subprocess (``run_cli``, ``interrupt_cli`` for Ctrl-C), the
  ``SMOKE`` overrides, the MLflow store it writes (``mlflow_runs``, ``mlflow_client``), ``TINY_TDMPC2``,
  ``check_trajectories_across_resume``, and ``ReplayedRows`` (what the n-step stage handed the replay).
- :mod:`helpers.fit`: ``FixedBatches``, ``K`` and ``ACT_N`` of the callback fits; the short fit with
  prioritized 3-step replay through the real data module (``fit_with_per_and_n_step``) and its checks
  (``check_per_and_n_step``), shared by the SAC and TD3/DDPG tests.
- :mod:`helpers.batches`: the one random-transition factory (``transitions``, with ``box`` for
  continuous actions), ``transition_data`` for a module built from a config, ``discrete_specs`` and the
  small quantile-family modules (``quantile_module``).
- :mod:`helpers.equivalence`: the callback equivalence harness (``run``, ``Recorder``, ``Result``, the
  comparisons and bounds, ``Bf16Bounds``, ``FamilyEquivalence``) and its cases: the DQN and TD-MPC2
  configs and data, each family's data builder and bf16 bounds.
- :mod:`helpers.toy`: a tiny LightningModule and DataModule implementing the hot-path protocol, a memory
  logger and seeded fits with their baselines, for the callback tests that need no real algorithm.
- :mod:`helpers.ddp`: ``ParamDump``, the callback the DDP tests add through the config
  (``+callbacks.dump._target_=helpers.ddp.ParamDump``).
"""
