"""``ichord cluster rehearse``: an operation played on a twin of the live cluster before it runs there.

    play.py   the whole command: read, twin, run, predict
    live.py   what is read of the live cluster (GET/LIST, read-only Talos calls; nothing written anywhere)
    twin.py   the simulators seeded with it
    run.py    the operation through the real cluster actor step and registry on the twin, time compressed
    model.py  how long each kind of step takes on a real cluster (defaults, overridable), the prediction
    report.py the timeline, the predicted duration and the stops, as a table or data
"""
