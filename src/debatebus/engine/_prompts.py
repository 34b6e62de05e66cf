"""The shipped prompts, in English and Spanish (a ``Language`` each). How templates are filled:
``debatebus.engine._templates``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

from debatebus.engine._templates import Template
from debatebus.exceptions import ConfigError

# Bump when a shipped prompt or the protocol's shape changes: checkpoints record it (drift guard).
PROTOCOL_VERSION = "2"


def word_limit_text(limits: Mapping[str, int], phase: str, language: Language) -> str:
    limit = limits.get(phase)
    return language.word_limit.format(limit=limit) if limit else ""


# Every shipped prompt shares one system prompt and opens with what the whole debate shares (question,
# framing, participants, transcript); the speaker's persona and task come last. Consecutive calls
# then share their longest prefix, which llama.cpp reuses instead of evaluating it again, and which
# OpenAI and Anthropic prompt caching reward. A speaker's own system prompt is its ``{persona}``.
SHARED_SYSTEM = (
    "You take part in a written debate. When it is your turn, write only your own contribution, "
    "in plain prose. Never write lines for other participants, never label speakers and never "
    "rewrite the debate."
)
_CONTEXT = (
    "Debate topic: {question}\n{framing}Participants: {participants}\n\nTranscript so far:\n"
    "{transcript}\n\n---\nNow it is {speaker}'s turn. {persona}\n"
)
_OPENING = (
    _CONTEXT + "Round {round}: give your opening position with your strongest arguments, in your "
    "own words only.{word_limit}"
)
_REBUTTAL = (
    _CONTEXT + "Round {round}: respond to the other participants, rebut what you disagree with "
    "and refine your position, in your own words only.{word_limit}"
)
_JUDGE = (
    _CONTEXT + "After round {round}, decide whether the participants have reached consensus and "
    "summarize the state of the debate in one or two sentences. Answer with JSON only, matching "
    "the requested schema."
)
_SYNTHESIS = (
    _CONTEXT + "Write a balanced synthesis: the points of agreement, the remaining tensions "
    "and a recommendation, each in a sentence of its own.{word_limit}"
)
_FRAMING = (
    "Debate topic: {question}\nParticipants: {participants}\n\n---\nNow it is {speaker}'s turn. "
    "{persona}\nFrame this debate in a few sentences: the key question, what is at stake and what "
    "a good answer must address."
)
_AUDIENCE = (
    "Debate topic: {question}\nAudience: {audience}\n\n---\nNow it is {speaker}'s turn. {persona}\n"
    "Describe what this audience knows, needs and cares about, so the participants can address "
    "it.{word_limit}"
)
_POSITION = (
    "Topic: {question}\n{framing}{audience}\n---\nNow it is {speaker}'s turn. {persona}{utility}\n"
    "State your independent position.{word_limit}"
)
_REVISION = (
    "Topic: {question}\n{framing}{audience}\n---\nNow it is {speaker}'s turn. {persona}{utility}\n"
    "The other participants' positions:\n{positions}\n\nRevise your position after considering "
    "theirs.{word_limit}"
)
_CROSS_SYNTHESIS_HEAD = (
    "Topic: {question}\n{audience}Revised positions, with what each participant maximizes and "
    "penalizes:\n{positions}\n\n---\nNow it is {speaker}'s turn. {persona}\nDo not average the "
    "positions. "
)
_CROSS_SYNTHESIS = (
    _CROSS_SYNTHESIS_HEAD + "Show the tensions between these utilities and the equilibrium that "
    "best respects them.{word_limit}"
)

# The same prompts in Spanish. Field names ({question}…) and the judge's JSON keys stay English.
_ES_CONTEXT = (
    "Tema del debate: {question}\n{framing}Participantes: {participants}\n\nTranscripción hasta "
    "ahora:\n{transcript}\n\n---\nAhora es el turno de {speaker}. {persona}\n"
)
_ES_CROSS_SYNTHESIS_HEAD = (
    "Tema: {question}\n{audience}Posiciones revisadas, con lo que cada participante maximiza y "
    "penaliza:\n{positions}\n\n---\nAhora es el turno de {speaker}. {persona}\nNo promedies las "
    "posiciones. "
)
_ES_PROMPTS = {
    "opening": _ES_CONTEXT + "Ronda {round}: expón tu posición inicial con tus argumentos más "
    "sólidos, solo con tus propias palabras.{word_limit}",
    "rebuttal": _ES_CONTEXT + "Ronda {round}: responde a los demás participantes, rebate aquello "
    "en lo que no estés de acuerdo y afina tu posición, solo con tus propias palabras.{word_limit}",
    "judge": _ES_CONTEXT + "Tras la ronda {round}, decide si los participantes han llegado a un "
    "consenso y resume el estado del debate en una o dos frases. Responde solo con JSON que siga "
    "el esquema pedido: los nombres de los campos, en inglés y tal como aparecen en el esquema; "
    "los textos, en español.",
    "synthesis": _ES_CONTEXT + "Escribe una síntesis equilibrada: los puntos de acuerdo, "
    "las tensiones que quedan y una recomendación, cada uno en una frase propia.{word_limit}",
    "framing": "Tema del debate: {question}\nParticipantes: {participants}\n\n---\nAhora es el "
    "turno de {speaker}. {persona}\nPresenta este debate en pocas frases: la pregunta clave, lo "
    "que está en juego y lo que debe abordar una buena respuesta.",
    "audience": "Tema del debate: {question}\nPúblico: {audience}\n\n---\nAhora es el turno de "
    "{speaker}. {persona}\nDescribe lo que este público sabe, necesita y valora, para que los "
    "participantes puedan dirigirse a él.{word_limit}",
    "position": "Tema: {question}\n{framing}{audience}\n---\nAhora es el turno de {speaker}. "
    "{persona}{utility}\nExpón tu propia posición, sin conocer aún las de los demás.{word_limit}",
    "revision": "Tema: {question}\n{framing}{audience}\n---\nAhora es el turno de {speaker}. "
    "{persona}{utility}\nLas posiciones de los demás participantes:\n{positions}\n\nRevisa tu "
    "posición después de considerar las suyas.{word_limit}",
}
_ES_CROSS_SYNTHESIS = (
    _ES_CROSS_SYNTHESIS_HEAD + "Muestra las tensiones entre estas utilidades y el equilibrio que "
    "mejor las respeta.{word_limit}"
)


@dataclass(frozen=True, slots=True)
class Prompts:
    """Overrides for any shipped prompt; ``None`` keeps the default."""

    opening: Template | None = None
    rebuttal: Template | None = None
    judge: Template | None = None
    synthesis: Template | None = None
    framing: Template | None = None
    audience: Template | None = None
    position: Template | None = None
    revision: Template | None = None

    def merged_over(self, base: Prompts) -> Prompts:
        return Prompts(
            **{f.name: getattr(self, f.name) or getattr(base, f.name) for f in fields(self)}
        )

    def get(self, name: str) -> Template:
        template: Template | None = getattr(self, name)
        if template is None:  # only reachable on an un-merged instance
            raise ConfigError(f"no prompt named {name!r}")
        return template


DEFAULT_PROMPTS = Prompts(
    opening=_OPENING,
    rebuttal=_REBUTTAL,
    judge=_JUDGE,
    synthesis=_SYNTHESIS,
    framing=_FRAMING,
    audience=_AUDIENCE,
    position=_POSITION,
    revision=_REVISION,
)
# Cross-pollination's synthesis weighs utilities instead of reading a transcript.
CROSS_POLLINATION_PROMPTS = Prompts(
    **{
        **{f.name: getattr(DEFAULT_PROMPTS, f.name) for f in fields(Prompts)},
        "synthesis": _CROSS_SYNTHESIS,
    }
)

#: Names ``synthesis_sections`` may list, in any order; or pass a custom structure string instead.
SECTION_NAMES = ("agreement", "tensions", "equilibrium", "answer", "risks", "next_steps")
SynthesisSections = str | Sequence[str]


@dataclass(frozen=True, slots=True)
class Language:
    """One language's shipped prompts and the phrases the engine writes into prompts."""

    code: str
    system: str
    prompts: Prompts  # round-robin's defaults; cross-pollination's synthesis is ``cross_synthesis``
    cross_synthesis: str
    synthesis_head: str  # how a synthesis prompt with sections opens, for each protocol
    cross_synthesis_head: str
    judge_persona: str
    synthesis_persona: str
    audience_persona: str
    word_limit: str
    framing_label: str
    audience_label: str
    utility: str
    sections: Mapping[str, str]
    sections_intro: str
    custom_structure: str
    # Sub-debates: the 1b offer (``{sub_debates}``), the child's question, the re-issue prompt.
    sub_debate_offer: str
    sub_debate_question: str
    sub_debate_feedback: str

    def defaults(self, protocol: str, sections: SynthesisSections | None,
                 sub_debates: bool = False) -> Prompts:
        """The shipped prompts of ``protocol``, the synthesis shaped by ``sections`` if given."""
        cross = protocol == "cross-pollination"
        if sections is None:
            synthesis = self.cross_synthesis if cross else self.prompts.synthesis
        else:
            head = self.cross_synthesis_head if cross else self.synthesis_head
            structure = self.structure(sections).replace("{", "{{").replace("}", "}}")
            synthesis = f"{head}{structure}{{word_limit}}"
        # Only a debate with sub-debates gets the field: the others' prompts (and hash) unchanged.
        revision = self.prompts.revision
        if sub_debates and isinstance(revision, str):
            revision += "{sub_debates}"
        return replace(self.prompts, synthesis=synthesis, revision=revision)

    def structure(self, sections: SynthesisSections) -> str:
        """The synthesis structure asked for: named sections in order, or a custom string."""
        if isinstance(sections, str):
            if not sections.strip():
                raise ConfigError("synthesis_sections is an empty string: describe the structure, "
                                  "or list section names such as ('tensions', 'answer')")
            return self.custom_structure.format(structure=sections.strip())
        names = list(sections)
        unknown = [n for n in names if n not in SECTION_NAMES]
        if not names or unknown or len(set(names)) != len(names):
            raise ConfigError(
                f"synthesis_sections {names!r} must list distinct names among "
                f"{list(SECTION_NAMES)} in the order wanted (or be a custom structure string)"
            )
        return self.sections_intro + "\n".join(f"- {self.sections[n]}" for n in names)

    def utility_text(self, maximizes: str, penalizes: str) -> str:
        return self.utility.format(maximizes=maximizes, penalizes=penalizes)


ENGLISH = Language(
    code="en",
    system=SHARED_SYSTEM,
    prompts=DEFAULT_PROMPTS,
    cross_synthesis=_CROSS_SYNTHESIS,
    synthesis_head=_CONTEXT + "Weigh every participant's arguments fairly. ",
    cross_synthesis_head=_CROSS_SYNTHESIS_HEAD,
    judge_persona=(
        "You are an impartial debate judge. You decide whether the participants agree, summarize "
        "the state of the debate and name a winner only when one argument clearly prevails."
    ),
    synthesis_persona="You synthesize debates neutrally.",
    audience_persona="You model the audience of a debate.",
    word_limit=" Answer in at most {limit} words.",
    framing_label="Framing: ",
    audience_label="Audience: ",
    utility=" You maximize: {maximizes}. You penalize: {penalizes}.",
    sections={
        "agreement": "Agreement: what the participants agree on.",
        "tensions": "Tensions: where the participants' goals pull against each other, and why.",
        "equilibrium": "Equilibrium: the course that best respects what each participant "
        "maximizes and penalizes, and what each one gives up for it.",
        "answer": "Answer: a direct, actionable answer to the question.",
        "risks": "Risks: what could go wrong with that answer, and the early signs to watch.",
        "next_steps": "Next steps: the first concrete actions, in order.",
    },
    sections_intro="Write the synthesis in these sections, in this order, each under its own "
    "heading:\n",
    custom_structure="Write the synthesis with this structure: {structure}",
    sub_debate_offer="\nIf a point needs specialists, you may ask a panel of them by writing "
    "REQUEST_SUB_DEBATE: <domain> on a line of its own, with one of these domains: {domains}.",
    sub_debate_question="{question}\n\nPosition of {speaker}, who asked this panel: {position}",
    sub_debate_feedback="\n\nA panel of {domain} specialists you asked concluded:\n{synthesis}"
    "\n\nRevise your position again, taking their conclusion into account.",
)
SPANISH = Language(
    code="es",
    system=(
        "Participas en un debate por escrito. Cuando sea tu turno, escribe solo tu propia "
        "intervención, en prosa. Nunca escribas líneas de otros participantes, nunca pongas "
        "etiquetas de hablante y nunca reescribas el debate."
    ),
    prompts=Prompts(**_ES_PROMPTS),
    cross_synthesis=_ES_CROSS_SYNTHESIS,
    synthesis_head=_ES_CONTEXT + "Sopesa con equidad los argumentos de cada participante. ",
    cross_synthesis_head=_ES_CROSS_SYNTHESIS_HEAD,
    judge_persona=(
        "Eres un juez de debates imparcial. Decides si los participantes están de acuerdo, "
        "resumes el estado del debate y nombras un ganador solo cuando un argumento se impone "
        "con claridad."
    ),
    synthesis_persona="Sintetizas debates con neutralidad.",
    audience_persona="Representas al público de un debate.",
    word_limit=" Responde en {limit} palabras como máximo.",
    framing_label="Encuadre: ",
    audience_label="Público: ",
    utility=" Maximizas: {maximizes}. Penalizas: {penalizes}.",
    sections={
        "agreement": "Acuerdos: en qué coinciden los participantes.",
        "tensions": "Tensiones: dónde chocan los objetivos de los participantes, y por qué.",
        "equilibrium": "Equilibrio: el camino que mejor respeta lo que cada participante "
        "maximiza y penaliza, y a qué renuncia cada uno por él.",
        "answer": "Respuesta: una respuesta directa y aplicable a la pregunta.",
        "risks": "Riesgos: qué podría salir mal con esa respuesta y qué señales tempranas vigilar.",
        "next_steps": "Próximos pasos: las primeras acciones concretas, en orden.",
    },
    sections_intro="Escribe la síntesis en estas secciones, en este orden, cada una con su "
    "propio título:\n",
    custom_structure="Escribe la síntesis con esta estructura: {structure}",
    sub_debate_offer="\nSi un punto necesita especialistas, puedes consultar a un panel de ellos "
    "escribiendo REQUEST_SUB_DEBATE: <dominio> en una línea aparte, con uno de estos dominios: "
    "{domains}.",
    sub_debate_question="{question}\n\nPosición de {speaker}, que consultó a este panel: "
    "{position}",
    sub_debate_feedback="\n\nEl panel de especialistas en {domain} que consultaste concluyó:\n"
    "{synthesis}\n\nRevisa de nuevo tu posición teniendo en cuenta su conclusión.",
)
LANGUAGES: Mapping[str, Language] = {lang.code: lang for lang in (ENGLISH, SPANISH)}


def language_named(code: str) -> Language:
    language = LANGUAGES.get(code)
    if language is None:
        raise ConfigError(f"unknown language {code!r}: use one of {sorted(LANGUAGES)}")
    return language
