"""Campaigns that check the library against reference models: random fault schedules (:mod:`.fuzz`), racing
drivers (:mod:`.driver_races`) and the in-process job both run (:mod:`.model_job`)."""
