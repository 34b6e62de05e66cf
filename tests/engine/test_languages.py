"""Languages and synthesis sections: the prompts each call receives, and the definition hash."""

from __future__ import annotations

from typing import Any

import pytest

from debatebus import Debate, Judge, Participant
from debatebus.engine import Prompts, Utility
from debatebus.engine._prompts import ENGLISH, SHARED_SYSTEM, SPANISH
from debatebus.exceptions import ConfigError

NAMES = ("alice", "bob")


def people(*, utility: bool = False) -> list[Participant]:
    u = Utility(maximizes="speed", penalizes="risk") if utility else None
    return [Participant(n, f"You are {n}.", utility=u) for n in NAMES]


async def test_spanish_round_robin_sends_spanish_prompts_and_system(make_stage):
    stage = make_stage(consensus_at=2)
    debate = Debate("es-rr", people(), llm=stage.llm, moderator=Participant("moderator", "M"),
                    judge=Judge(), max_rounds=2, language="es",
                    word_limits={"opening": 50, "synthesis": 90})
    result = await debate.run("¿Adoptamos microservicios?")

    assert result.ok and result.verdict is not None and result.verdict.consensus is True
    assert {r.system for r in stage.requests} == {SPANISH.system}
    framing = stage.prompt_of("moderator", "framing", 0)
    assert framing.startswith("Tema del debate: ¿Adoptamos microservicios?\nParticipantes: ")
    assert "Presenta este debate en pocas frases" in framing
    opening = stage.prompt_of("bob", "opening", 1)
    assert "Encuadre: moderator framing 0\n" in opening
    assert "Ahora es el turno de bob. You are bob.\nRonda 1: expón tu posición inicial" in opening
    assert opening.endswith(" Responde en 50 palabras como máximo.")
    assert "Ronda 2: responde a los demás participantes" in stage.prompt_of("alice", "rebuttal", 2)
    judge = stage.prompt_of("judge", "judge", 2)
    # the judge's persona and instructions are Spanish; its JSON keys stay English
    assert f"Ahora es el turno de judge. {SPANISH.judge_persona}\nTras la ronda 2" in judge
    assert "Responde solo con JSON que siga el esquema pedido" in judge
    assert "nombres de los campos, en inglés" in judge
    synthesis = stage.prompt_of("moderator", "synthesis", 2)
    assert "Escribe una síntesis equilibrada" in synthesis
    assert synthesis.endswith(" Responde en 90 palabras como máximo.")
    for request in stage.requests:  # no English phrase of ours is left
        for english in ("Debate topic", "Now it is", "Answer in at most", "Framing:", "Round 1:"
                        " give"):
            assert english not in request.prompt, (request.purpose, english)


async def test_spanish_cross_pollination_translates_utilities_audience_and_synthesis(make_stage):
    stage = make_stage()
    debate = Debate("es-x", people(utility=True), llm=stage.llm, protocol="cross-pollination",
                    audience="equipos pequeños", language="es")
    result = await debate.run("¿Kafka o Redis?")

    assert result.ok
    assert {r.system for r in stage.requests} == {SPANISH.system}
    assert "Representas al público de un debate." in stage.prompt_of("audience", "audience", 0)
    position = stage.prompt_of("alice", "position", 1)
    assert "Público: audience audience 0\n" in position
    assert "You are alice. Maximizas: speed. Penalizas: risk.\nExpón tu propia posición" in position
    revision = stage.prompt_of("bob", "revision", 2)
    assert "[alice] Maximizas: speed. Penalizas: risk. alice position 1" in revision
    assert "Revisa tu posición después de considerar las suyas." in revision
    synthesis = stage.prompt_of("synthesis", "synthesis", 2)
    assert "Sintetizas debates con neutralidad.\nNo promedies las posiciones." in synthesis
    assert "Muestra las tensiones entre estas utilidades" in synthesis


async def test_english_stays_the_default(make_stage):
    stage = make_stage()
    await Debate("en", people(), llm=stage.llm, judge=Judge(), max_rounds=1).run("t")
    assert {r.system for r in stage.requests} == {SHARED_SYSTEM}
    assert f"{ENGLISH.judge_persona}\nAfter round 1" in stage.prompt_of("judge", "judge", 1)


def test_a_judge_persona_of_your_own_is_kept(make_stage):
    own = Judge(system_prompt="Juzga con severidad.")
    debate = Debate("es", people(), llm=make_stage().llm, judge=own, language="es")
    assert debate.judge is not None and debate.judge.system_prompt == "Juzga con severidad."


def test_an_unknown_language_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown language 'fr': use one of \['en', 'es'\]"):
        Debate("fr", people(), llm=None, language="fr")


# ---- synthesis sections -------------------------------------------------------------------------


async def test_sections_shape_the_cross_pollination_synthesis(make_stage):
    stage = make_stage()
    debate = Debate("x", people(utility=True), llm=stage.llm, protocol="cross-pollination",
                    synthesis_sections=("tensions", "equilibrium", "answer"))
    await debate.run("t")
    synthesis = stage.prompt_of("synthesis", "synthesis", 2)
    assert synthesis.endswith(
        "Do not average the positions. Write the synthesis in these sections, in this order, "
        "each under its own heading:\n"
        f"- {ENGLISH.sections['tensions']}\n- {ENGLISH.sections['equilibrium']}\n"
        f"- {ENGLISH.sections['answer']} Answer in at most 380 words."
    )
    # sections shape the synthesis prompt only
    assert all("Write the synthesis in these sections" not in r.prompt
               for r in stage.requests if r.purpose != "synthesis")


async def test_sections_shape_the_round_robin_synthesis_in_spanish(make_stage):
    stage = make_stage()
    debate = Debate("rr", people(), llm=stage.llm, moderator=Participant("moderator", "M"),
                    max_rounds=1, language="es", synthesis_sections=("answer", "risks"))
    await debate.run("t")
    synthesis = stage.prompt_of("moderator", "synthesis", 1)
    assert "alice said:\n> alice opening 1" in synthesis  # it still reads the transcript
    assert synthesis.endswith(
        "Sopesa con equidad los argumentos de cada participante. Escribe la síntesis en estas "
        "secciones, en este orden, cada una con su propio título:\n"
        f"- {SPANISH.sections['answer']}\n- {SPANISH.sections['risks']}"
    )


async def test_a_custom_structure_reaches_the_prompt_verbatim(make_stage):
    stage = make_stage()
    custom = "Decision first, then {caveats} and a 3-item plan."
    debate = Debate("c", people(), llm=stage.llm, protocol="cross-pollination",
                    synthesis_sections=custom)
    await debate.run("t")
    assert f"Write the synthesis with this structure: {custom} Answer in at most" in (
        stage.prompt_of("synthesis", "synthesis", 2))


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (("tensions", "verdict"), r"must list distinct names among \['agreement', 'tensions'"),
        (("answer", "answer"), r"must list distinct names"),
        ((), r"must list distinct names"),
        ("   ", r"synthesis_sections is an empty string"),
    ],
)
def test_bad_sections_say_what_to_fix(make_stage, sections, message):
    with pytest.raises(ConfigError, match=message):
        Debate("x", people(), llm=make_stage().llm, protocol="cross-pollination",
               synthesis_sections=sections)


def test_sections_need_a_synthesis_to_shape(make_stage):
    llm = make_stage().llm
    with pytest.raises(ConfigError, match=r"writes none: pass synthesizer=… or moderator=…"):
        Debate("rr", people(), llm=llm, synthesis_sections=("answer",))
    with pytest.raises(ConfigError, match=r"which prompts.synthesis replaces"):
        Debate("x", people(), llm=llm, protocol="cross-pollination",
               prompts=Prompts(synthesis="{positions}"), synthesis_sections=("answer",))


def test_the_definition_hash_follows_sections_and_language(make_stage):
    llm = make_stage().llm

    def hash_of(**options: Any) -> str:
        return Debate("h", people(), llm=llm, protocol="cross-pollination",
                      judge=Judge(), **options).definition_hash

    plain = hash_of()
    assert hash_of() == plain
    assert hash_of(synthesis_sections=("tensions", "answer")) != plain
    assert hash_of(synthesis_sections=("answer", "tensions")) != hash_of(
        synthesis_sections=("tensions", "answer"))
    assert hash_of(synthesis_sections="Answer, then risks.") != plain
    assert hash_of(language="es") != plain
    assert hash_of(on_metrics=print) == plain  # a callback changes nothing the debate says
