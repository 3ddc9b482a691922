

def test_the_public_api_is_exact_and_importable() -> None:
    import forge.curate

    assert all(hasattr(forge.curate, name) for name in forge.curate.__all__)
    assert len(forge.curate.__all__) == len(set(forge.curate.__all__))
