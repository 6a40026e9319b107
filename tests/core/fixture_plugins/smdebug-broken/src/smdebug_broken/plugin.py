raise ImportError("smdebug_broken needs a framework that is not installed")
