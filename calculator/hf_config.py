def model_from_hf_config(x): raise NotImplementedError
